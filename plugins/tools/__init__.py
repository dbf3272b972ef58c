"""Programs rackbench ships to the nodes and runs there (standard library only, Python 3.8+).

They are plain scripts, not modules of the Django project: a plug-in reads their source text and writes it
into the run directory (``HostCommand.files``). Nothing here may import Django or any rackbench module.
"""
