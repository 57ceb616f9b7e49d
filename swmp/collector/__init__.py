"""A local SkyWalking backend for development and CI (``swmp collector``; docs/collector.md).

``decode`` (wire messages -> documents), ``store`` (SQLite), ``intake`` (count, store, refuse),
``grpc_receiver`` and ``http_server`` (receivers, JSON API, page), ``server`` (lifecycle, run),
``options`` (its command line). Import what you use: nothing is imported here, so ``swmp
--help`` does not load gRPC.
"""
