"""The fault suite's harness: a backend that can be faulted, paced load, and the accounting.

* :mod:`tests.faults.proxy`: a TCP proxy that can refuse (port closed), black-hole (accept,
  never answer) or pass connections through to the collector.
* :mod:`tests.faults.backend`: the in-test gRPC collector behind that proxy, able to answer
  errors and to reject oversized messages, keeping only the trace ids it received.
* :mod:`tests.faults.load`: paced load whose every request carries a fresh trace id (``sw8``).
* :mod:`tests.faults.scenario`: Gunicorn under ``swmp run`` with the real reporter, and the
  served / delivered / duplicated / lost line each scenario prints.
"""
