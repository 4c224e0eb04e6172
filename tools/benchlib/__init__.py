"""tools/bench.py's measurements, a module per row or concern (the bench's docstring says what each row measures).

Layers, lowest first: core (paths, targets, running and checking a process, the
figures' rows), clocks, environment, commands, schema_chain, memory, runs (the
rounds), mcp_wait, fanout, inprocess, dag, waitperf, report, main (the command
line). A dev tool: it imports spawn and tools/mock_model.py, which tools/bench.py
puts on sys.path before it imports this package.
"""
