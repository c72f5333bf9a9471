"""`kron bench`: throughput, lateness and recovery measured against a real local stack.

Every scenario starts its own broker (on free ports), workers and, where needed, the API,
and stops them again. Correctness numbers (lost, duplicates) come from the replay audit of
the recorded history, never from counters inside the engine.
"""
