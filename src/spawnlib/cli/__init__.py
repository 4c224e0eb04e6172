"""cli: the entry points: main(), the verbs, task graphs, the Python API.

The only layer that turns exceptions into exit codes (main). A module here
may import any layer.
"""
