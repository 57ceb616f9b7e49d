"""Small instrumented applications run as real subprocesses by the end-to-end tests."""
