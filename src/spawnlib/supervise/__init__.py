"""supervise: processes and their one home of supervision.

Who a process is and whether it lives (Supervised), cgroups, guards,
ancestry, the compiled copy spawn.py starts from, Ray placement's seam, and
the one commit point of an agent's outcome. A module here imports only
supervise/, session/ and core/.
"""
