"""Operations tooling behind the ``swmp health`` and ``swmp status`` commands.

Read-only by design: it opens arenas of the current user, reads counters and the
reporter's status document, and never writes to shared memory or signals a process.

Use it from a separate process (the CLI is one). POSIX record locks belong to the process,
and closing *any* descriptor of a file drops all of that process's locks on it: opening and
closing an arena here inside a worker or reporter would release its slot or reporter lock.

* :mod:`swmp.ops.locate` - finding arenas (directory, service, pid, path; refusing others')
* :mod:`swmp.ops.sample` - one consistent reading of an arena
* :mod:`swmp.ops.checks` - the health checks and probe modes
* :mod:`swmp.ops.report` - the JSON documents (the public shape)
* :mod:`swmp.ops.render` - text output, 80 columns
* :mod:`swmp.ops.schema` - JSON Schemas of the documents
"""
