"""Span tags as objects, as in ``skywalking.trace.tags``: ``span.tag(TagHttpURL(url))``.

Subclass :class:`Tag` with a ``key`` for your own (``class TagSinger(Tag): key = "Singer"``).
"""

from __future__ import annotations


class Tag:
    key: str = ""
    overridable: bool = True

    def __init__(self, val: object) -> None:
        try:
            self.val = str(val)
        except ValueError:
            raise ValueError("Tag value must be a string or convertible to a string") from None


def _tag(name: str, key: str, overridable: bool = True) -> type[Tag]:
    return type(name, (Tag,), {"key": key, "overridable": overridable})


TagHttpMethod = _tag("TagHttpMethod", "http.method")
TagHttpURL = _tag("TagHttpURL", "http.url")
TagHttpStatusCode = _tag("TagHttpStatusCode", "http.status_code")
TagHttpStatusMsg = _tag("TagHttpStatusMsg", "http.status_msg")
TagHttpParams = _tag("TagHttpParams", "http.params")
TagDbType = _tag("TagDbType", "db.type")
TagDbInstance = _tag("TagDbInstance", "db.instance")
TagDbStatement = _tag("TagDbStatement", "db.statement")
TagDbSqlParameters = _tag("TagDbSqlParameters", "db.sql.parameters", overridable=False)
TagCacheType = _tag("TagCacheType", "cache.type")
TagCacheOp = _tag("TagCacheOp", "cache.op")
TagCacheCmd = _tag("TagCacheCmd", "cache.cmd")
TagCacheKey = _tag("TagCacheKey", "cache.key")
TagMqBroker = _tag("TagMqBroker", "mq.broker")
TagMqTopic = _tag("TagMqTopic", "mq.topic")
TagMqQueue = _tag("TagMqQueue", "mq.queue")
TagCeleryParameters = _tag("TagCeleryParameters", "celery.parameters")
TagGrpcMethod = _tag("TagGrpcMethod", "grpc.method")
TagGrpcUrl = _tag("TagGrpcUrl", "grpc.url")
TagGrpcStatusCode = _tag("TagGrpcStatusCode", "grpc.status_code")
