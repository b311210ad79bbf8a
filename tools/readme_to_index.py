"""Write README.md into `nbs/index.ipynb` (the documentation's home page): one markdown cell per `## ` section,
after the notebook's first cell (its hidden import check), which stays. README.md is written by hand (nbdev_readme
needs Quarto); `tests/test_layout.py` checks that the two say the same. Run `python tools/readme_to_index.py`, then
`nbdev_clean`."""
import hashlib, json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README, INDEX = ROOT/'README.md', ROOT/'nbs'/'index.ipynb'

def sections(text:str)->list:
    "`text` split before each line that starts with '## ' outside a code fence; each part without its last newline"
    parts, cur, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith('```'): fenced = not fenced
        if line.startswith('## ') and not fenced and cur:
            parts.append(cur); cur = []
        cur.append(line)
    parts.append(cur)
    return ['\n'.join(p).strip('\n') for p in parts]

def index_markdown(nb:dict)->list:
    "The markdown cells' texts of the notebook `nb`"
    return [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown']

def main():
    nb = json.loads(INDEX.read_text())
    first = nb['cells'][0]
    assert first['cell_type'] == 'code', 'nbs/index.ipynb should start with its hidden code cell'
    cells = [first]
    for text in sections(README.read_text()):
        cid = hashlib.sha1(text.split('\n', 1)[0].encode()).hexdigest()[:8]   # stable while the heading is
        cells.append({'cell_type': 'markdown', 'id': cid, 'metadata': {}, 'source': text.splitlines(keepends=True)})
    nb['cells'] = cells
    INDEX.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    print(f'{INDEX.relative_to(ROOT)}: {len(cells) - 1} markdown cells from README.md')

if __name__ == '__main__': main()
