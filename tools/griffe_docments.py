"""A Griffe extension (mkdocstrings' Python handler loads it, `mkdocs.yml`): parameters documented the fastcore way,
with a `#` comment after each one (fastcore's `docments`, which nbdev's `show_doc` reads), get their rows in the
API entry's parameter table as if the docstring had a Google-style `Args:` section; the comment after the return
annotation becomes its `Returns:`. A docstring that has its own `Args:` (or `Returns:`) section keeps it. A method
added to a class with fastcore's `@patch` (`Learner.distrib_ctx`) is shown without its `self`, as a method is."""
import ast, io, tokenize
from pathlib import Path
import griffe

def _comments(lines:list, first:int, last:int)->dict:
    "line number -> the text of the `#` comment on it, for lines `first`..`last` (1-based) of `lines`"
    src = '\n'.join(lines[first-1:last]) + '\n'
    out = {}
    try:
        for t in tokenize.generate_tokens(io.StringIO(src).readline):
            if t.type == tokenize.COMMENT: out[first + t.start[0] - 1] = t.string.lstrip('#').strip()
    except (tokenize.TokenError, IndentationError): pass   # the signature alone need not be complete code
    return out

def _text(comment:str)->str:
    "A comment as Markdown: `<` outside backticks escaped (`cuda:<local rank>` is not an HTML tag)"
    parts = comment.split('`')
    return '`'.join(p if i % 2 else p.replace('<', '&lt;') for i, p in enumerate(parts))

def docments(node:ast.FunctionDef, lines:list)->tuple:
    "`({parameter: comment}, return comment or None)` of the function `node` whose module's source is `lines`"
    a = node.args
    args = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]
    end = node.body[0].lineno - 1 if node.body else node.lineno
    if node.body and isinstance(node.body[0], ast.Expr): end = node.body[0].lineno - 1   # up to the docstring
    cs = _comments(lines, node.lineno, max(end, node.lineno))
    star = {id(a.vararg): '*', id(a.kwarg): '**'}
    params = {star.get(id(p), '') + p.arg: _text(cs[p.lineno]) for p in args
              if p.lineno in cs and p.arg not in ('self', 'cls')}
    ret = _text(cs[node.returns.end_lineno]) if node.returns is not None and node.returns.end_lineno in cs else None
    if ret is not None and any(p.lineno == node.returns.end_lineno for p in args): ret = None  # a parameter's comment
    return params, ret

class Docments(griffe.Extension):
    """Turn a function's docments into the `Args:`/`Returns:` sections of its docstring, and the comment after a
    module constant (`INTERVAL = 1.0  # seconds between two heartbeats`) into its docstring when it has none"""
    def on_attribute_instance(self, *, node, attr:griffe.Attribute, **kwargs):
        if attr.docstring is not None or attr.filepath is None or not hasattr(node, 'end_lineno'): return
        cs = _comments(Path(attr.filepath).read_text().splitlines(), node.lineno, node.end_lineno)
        if node.end_lineno in cs: attr.docstring = griffe.Docstring(_text(cs[node.end_lineno]), parent=attr)

    def on_function_instance(self, *, node, func:griffe.Function, **kwargs):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.filepath is None: return
        patched = any(getattr(d, 'id', getattr(d, 'attr', None)) == 'patch' for d in node.decorator_list)
        if patched and 'self' in func.parameters: del func.parameters['self']   # `learn.x(...)`: no `self` to pass
        params, ret = docments(node, Path(func.filepath).read_text().splitlines())
        if not params and not ret: return
        text = func.docstring.value if func.docstring else ''
        add = []
        if params and 'Args:' not in text:
            add += ['Args:'] + [f"    {k}: {v}" for k, v in params.items()]
        if ret and 'Returns:' not in text: add += ['Returns:', f"    {ret}"]
        if not add: return
        value = (text + '\n\n' if text else '') + '\n'.join(add)
        if func.docstring: func.docstring.value = value
        else: func.docstring = griffe.Docstring(value, parent=func)
