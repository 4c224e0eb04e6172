"""core: what every layer stands on, and nothing of spawn.py's own I/O.

Constants, the exit codes and errors, the records that mirror schemas/, pure
functions (limits, costs, redaction, JSON bounds), where an agent is placed,
the built-in files, and the prelude that a nested spawn runs before any other
import. A module here imports only core/ (and programs/, the texts).
"""
