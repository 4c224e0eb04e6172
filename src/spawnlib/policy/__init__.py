"""policy: what an agent may do, and how much.

Admission (--max-agents, the budget, slots), agent definitions and permission
rules, asks and their answers, the budget pause and the inbox. A module here
imports only policy/ and the layers below it (supervise/, session/, core/).
"""
