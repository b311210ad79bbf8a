"""A MkDocs hook (`mkdocs.yml`: `hooks:`): the site's navigation, made from the pages' names (the notebooks'):
the home page, the pages a user reads first (`START`, in that order), the guides (`GUIDES`: the pages about the
whole job rather than one module, in that order), then one section per layer, in the notebooks' order. The
notebooks are numbered by layer (the Development page, "Where things are"): `LAYERS` maps the numbers to the
sections, so a new notebook gets its place without an edit here. The guides are numbered after the modules (50 on),
the development page last (90); a page listed in `START` or `GUIDES` shows there only."""
import re
from pathlib import Path

START = ['33_strategies.context', '44_fastai', '19_learner', '11_data', '23_callback.checkpoint', '39_launch.cli',
         '41_launch.notebook', '25_callback.lr_find', '14_recorder']   # what a training script calls
GUIDES = ['50_usage', '51_failures', '35_exactness', '52_performance']   # what a user reads about the whole job
LAYERS = [(0, 'Runtime'), (11, 'Data and the loop'), (20, 'Callbacks'), (31, 'Strategies'), (38, 'Launch'),
          (43, 'The public API'), (44, "fastai's Learner"), (50, 'Guides'),
          (90, 'Development')]   # (first notebook number, section)

def section(stem:str)->str:
    "The section of the page `stem` (`NN_name`, `NNa_name`), by its number"
    n = int(re.match(r'\d+', stem).group())
    return [name for first, name in LAYERS if n >= first][-1]

def on_config(config, **kwargs):
    stems = sorted(p.stem for p in Path(config['docs_dir']).glob('*.md') if p.stem != 'index')
    placed = [s for s in START + GUIDES if s in stems]
    guides = [s for s in GUIDES if s in stems] + [s for s in stems if s not in placed and section(s) == 'Guides']
    nav = [{'Home': 'index.md'}, {'Start here': [f'{s}.md' for s in START if s in stems]},
           {'Guides': [f'{s}.md' for s in guides]}]
    for _, name in LAYERS:
        pages = [f'{s}.md' for s in stems if s not in placed and section(s) == name and name != 'Guides']
        if pages: nav.append({name: pages})
    config['nav'] = nav
    return config
