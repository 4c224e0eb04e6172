"""session: the on-disk session protocol (sessions/README.md, schemas/).

Atomic writes, the records' readers and writers, markers, the ledger. A
module here imports only session/ and core/.
"""
