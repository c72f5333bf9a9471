"""Failure alerts sent to webhooks, off the executions' path (docs/semantics.md, Failure
alerts): signing.py signs and verifies, backoff.py spaces the tries, event.py builds what
is sent, notifier.py queues and delivers, consumer.py feeds it from kron.dead-letters."""
