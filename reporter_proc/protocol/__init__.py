"""The SkyWalking v3 protocol: the project's own ``.proto`` files and the modules generated from them.

``skywalking/v3/*.proto`` are written from the field table in the project's protocol notes;
``generated/`` holds what ``scripts/gen_protos.sh`` makes of them (never edited by hand; a
test fails when it is stale). Importing this package imports no generated code: the hot
paths (``reporter_proc.encode``, ``reporter_proc.jsonwire``) do not need protobuf at all.
"""
