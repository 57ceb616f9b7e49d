"""``swmp traces``: recent traces and one trace as a tree, from the local collector or an
OAP. ``model`` (one span shape, the tree), ``sources`` (collector JSON API, OAP GraphQL),
``render`` (terminal text), ``oap`` (the GraphQL client, shared with the e2e tests)."""
