"""Starting processes: `python -m distrib.launch` over torchrun, the worker that runs a script, `notebook_launch`."""
