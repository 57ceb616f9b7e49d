/* The facts of a delivered RabbitMQ message, read from the client's own objects, and the
 * entry span around its callback: swmp/instrument/pika.py's ``_consuming`` and
 * ``_traced_callback``, swmp/instrument/aiormq.py's ``_message_facts`` (the Python forms:
 * the reference, and what runs without the native core).
 *
 * And the peers alone (``pika_peer``, ``aiormq_peer``: the ``_peer`` functions), which the
 * publishing wrappers use.
 *
 * Why: amqp_consuming (consume.c) took the span itself out of Python, but a pika delivery
 * still ran four frames of the agent's around it (the callback wrapper, ``_consuming``,
 * ``_impl``, ``_peer``, which calls two Python properties of pika's connection parameters)
 * and an aiormq delivery two (``_message_facts``, ``_peer``), each entered with the CPU
 * caches cold after the wait for the broker.
 *
 * Every step is the Python form's: ``getattr(x, name, default)`` where it has one (only an
 * AttributeError gives the default), ``value or ""`` by truth, the peer an f-string of the
 * host and port (``format(v, "")`` of each). The peer is remembered for the last
 * connection parameters object (pika) or URL (aiormq) seen, held so that its identity
 * cannot be reused: a connection keeps its parameters, and its peer does not change while
 * it is connected. An ``Exception`` reading the peer gives "" as ``_peer``'s ``except``
 * does (not remembered). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "attrcache.h"
#include "consume.h"
#include "deliver.h"
#include "spancore.h"

static PyObject *s_impl, *s_connection, *s_params, *s_host, *s_port, *s_url, *s_exchange, *s_routing_key,
    *s_headers, *s_properties, *s_delivery, *s_header, *s_empty, *s_enter, *s_exit;

/* The names, made at the first call (out of line: every later call only tests a pointer, a
 * line of code fewer for a call that starts with cold caches). */
__attribute__((noinline, cold)) static int intern_names(void) {
    const char *texts[] = {"_impl", "connection", "params", "host", "port", "url", "exchange", "routing_key",
                           "headers", "properties", "delivery", "header", "", "__enter__", "__exit__"};
    PyObject **vars[] = {&s_impl, &s_connection, &s_params, &s_host, &s_port, &s_url, &s_exchange, &s_routing_key,
                         &s_headers, &s_properties, &s_delivery, &s_header, &s_empty, &s_enter, &s_exit};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if ((*vars[i] = PyUnicode_InternFromString(texts[i])) == NULL) {
            return -1;
        }
    }
    return 0;
}

static inline int interned(void) {
    return s_exit != NULL ? 0 : intern_names();
}

/* getattr(obj, name, fallback): a new reference, or NULL with an error that is not an
 * AttributeError. With a call site's ``cache`` (not NULL), a __slots__ attribute (pamqp's
 * frames and properties) is read where it lies (attrcache.c), which is what getattr gives;
 * pika's objects have no slots, so its call sites pass NULL and skip the cache's check. */
static PyObject *attr_or(PyObject *obj, PyObject *name, PyObject *fallback, swmp_AttrCache *cache) {
    PyObject *v = cache == NULL ? swmp_optional_attr(obj, name) : swmp_slot_attr_optional(obj, name, cache);
    return v != NULL || PyErr_Occurred() ? v : Py_NewRef(fallback);
}

/* ``getattr(obj, name, None) or ""``: a new reference or NULL. */
static PyObject *text_or_empty(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyObject *v = attr_or(obj, name, Py_None, cache);
    if (v == NULL) {
        return NULL;
    }
    int truth = PyObject_IsTrue(v);
    if (truth <= 0) {
        Py_DECREF(v);
        return truth < 0 ? NULL : Py_NewRef(s_empty);
    }
    return v;
}

/* f"{a}:{b}": a new reference or NULL. */
static PyObject *host_port(PyObject *host, PyObject *port) {
    PyObject *h = PyObject_Format(host, s_empty);
    PyObject *p = h == NULL ? NULL : PyObject_Format(port, s_empty);
    PyObject *joined = p == NULL ? NULL : PyUnicode_FromFormat("%U:%U", h, p);
    Py_XDECREF(h);
    Py_XDECREF(p);
    return joined;
}

/* The last peer worked out, with the object it was worked out from (held). */
typedef struct {
    PyObject *source;
    PyObject *peer;
} PeerMemo;

static PeerMemo pika_memo, aiormq_memo;

/* A ``_peer(channel)`` of the Python forms: ``address`` of ``channel.connection.<attr>``,
 * remembered for that object; "" when reading it raises an Exception (their ``except
 * Exception``, not remembered), another error passes on. */
static PyObject *memo_peer(PyObject *channel, PyObject *attr, PeerMemo *memo, PyObject *(*address)(PyObject *)) {
    PyObject *conn = PyObject_GetAttr(channel, s_connection);
    PyObject *source = conn == NULL ? NULL : PyObject_GetAttr(conn, attr);
    Py_XDECREF(conn);
    PyObject *peer = NULL;
    if (source != NULL && source == memo->source) {
        peer = Py_NewRef(memo->peer);
    } else if (source != NULL && (peer = address(source)) != NULL) {
        Py_XSETREF(memo->source, Py_NewRef(source));
        Py_XSETREF(memo->peer, Py_NewRef(peer));
    }
    Py_XDECREF(source);
    if (peer == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        peer = Py_NewRef(s_empty);
    }
    return peer;
}

/* pika's: ``f"{p.host}:{p.port}"`` of the connection parameters. */
static PyObject *pika_address(PyObject *params) {
    PyObject *host = PyObject_GetAttr(params, s_host);
    PyObject *port = host == NULL ? NULL : PyObject_GetAttr(params, s_port);
    PyObject *peer = port == NULL ? NULL : host_port(host, port);
    Py_XDECREF(host);
    Py_XDECREF(port);
    return peer;
}

/* aiormq's: of the connection URL, ``f"{url.host}:{url.port}"`` when it has a port, else
 * ``str(url.host)`` (the port read first, as the expression reads them). */
static PyObject *aiormq_address(PyObject *url) {
    PyObject *peer = NULL, *host = NULL;
    PyObject *port = PyObject_GetAttr(url, s_port);
    int has_port = port == NULL ? -1 : PyObject_IsTrue(port);
    if (has_port >= 0 && (host = PyObject_GetAttr(url, s_host)) != NULL) {
        peer = has_port ? host_port(host, port) : PyObject_Str(host);
    }
    Py_XDECREF(host);
    Py_XDECREF(port);
    return peer;
}

static PyObject *pika_peer(PyObject *channel) {
    return memo_peer(channel, s_params, &pika_memo, pika_address);
}

static PyObject *aiormq_peer(PyObject *channel) {
    return memo_peer(channel, s_url, &aiormq_memo, aiormq_address);
}

PyObject *swmp_pika_peer(PyObject *module, PyObject *channel) {
    return interned() < 0 ? NULL : pika_peer(channel);
}

PyObject *swmp_aiormq_peer(PyObject *module, PyObject *channel) {
    return interned() < 0 ? NULL : aiormq_peer(channel);
}

/* amqp_consuming(exchange, routing_key, headers, peer) with the references given up. */
static PyObject *consuming_of(PyObject *exchange, PyObject *routing_key, PyObject *headers, PyObject *peer) {
    PyObject *cm = NULL;
    if (exchange != NULL && routing_key != NULL && headers != NULL && peer != NULL) {
        PyObject *args[4] = {exchange, routing_key, headers, peer};
        cm = swmp_amqp_consuming(NULL, args, 4);
    }
    Py_XDECREF(exchange);
    Py_XDECREF(routing_key);
    Py_XDECREF(headers);
    Py_XDECREF(peer);
    return cm;
}

/* pika_consuming(channel, method, properties): the entry span's context manager for a
 * message delivered on ``channel`` (pika.channel.Channel). */
static PyObject *pika_consuming_of(PyObject *channel, PyObject *method, PyObject *properties) {
    if (interned() < 0) {
        return NULL;
    }
    PyObject *exchange = text_or_empty(method, s_exchange, NULL);
    PyObject *routing_key = exchange == NULL ? NULL : text_or_empty(method, s_routing_key, NULL);
    PyObject *headers = routing_key == NULL ? NULL : attr_or(properties, s_headers, Py_None, NULL);
    PyObject *peer = headers == NULL ? NULL : pika_peer(channel);
    return consuming_of(exchange, routing_key, headers, peer);
}

PyObject *swmp_pika_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pika_consuming(channel, method, properties)");
        return NULL;
    }
    return pika_consuming_of(args[0], args[1], args[2]);
}

PyObject *swmp_aiormq_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "aiormq_consuming(channel, message)");
        return NULL;
    }
    if (interned() < 0) {
        return NULL;
    }
    /* pamqp's Basic.Deliver and Basic.Properties keep their fields in slots */
    static swmp_AttrCache at_exchange, at_routing_key, at_headers;
    PyObject *exchange = NULL, *routing_key = NULL, *headers = NULL, *peer = NULL;
    PyObject *delivery = PyObject_GetAttr(args[1], s_delivery);
    if (delivery != NULL) {
        exchange = text_or_empty(delivery, s_exchange, &at_exchange);
        routing_key = exchange == NULL ? NULL : text_or_empty(delivery, s_routing_key, &at_routing_key);
        Py_DECREF(delivery);
    }
    if (routing_key != NULL) {
        /* getattr(getattr(message.header, "properties", None), "headers", None) */
        PyObject *header = PyObject_GetAttr(args[1], s_header);
        PyObject *props = header == NULL ? NULL : attr_or(header, s_properties, Py_None, NULL);
        Py_XDECREF(header);
        headers = props == NULL ? NULL : attr_or(props, s_headers, Py_None, &at_headers);
        Py_XDECREF(props);
    }
    peer = headers == NULL ? NULL : aiormq_peer(args[0]);
    return consuming_of(exchange, routing_key, headers, peer);
}

/* -- pika_callback ---------------------------------------------------------------------- */

/* ``callback(channel, method, properties, body)`` run inside the message's entry span:
 * what a consumer's callback becomes. The facts are read from the channel's implementation
 * (``getattr(channel, "_impl", channel)``) for a BlockingChannel consumer's (``via_impl``),
 * from the channel given for one that pika's Channel calls itself. */
typedef struct {
    PyObject_HEAD
    PyObject *callback;
    vectorcallfunc vectorcall;
    int via_impl; /* the channel given is a BlockingChannel: the facts from its ``_impl`` */
} PikaCallback;

static int pcb_traverse(PikaCallback *self, visitproc visit, void *arg) {
    Py_VISIT(self->callback);
    return 0;
}

static int pcb_clear(PikaCallback *self) {
    Py_CLEAR(self->callback);
    return 0;
}

static void pcb_dealloc(PikaCallback *self) {
    PyObject_GC_UnTrack(self);
    pcb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ``with cm: return callable(*args)``: the result, or NULL with the callable's error (or
 * the context manager's own, which replaces it as ``with`` does). Consumes ``cm``. */
static PyObject *call_within(PyObject *cm, PyObject *callable, PyObject *const *args, size_t nargsf) {
    PyObject *entered = swmp_cm_enter(cm, s_enter);
    if (entered == NULL) {
        Py_DECREF(cm);
        return NULL;
    }
    Py_DECREF(entered);
    PyObject *result = PyObject_Vectorcall(callable, args, nargsf, NULL);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
    }
    PyObject *call[4] = {cm, type ? type : Py_None, value ? value : Py_None, tb ? tb : Py_None};
    PyObject *r = swmp_cm_exit(call, s_exit);
    Py_DECREF(cm);
    if (r == NULL) { /* the exit's own error */
        Py_XDECREF(result);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    int suppressed = result == NULL ? PyObject_IsTrue(r) : 0;
    Py_DECREF(r);
    if (result != NULL) {
        return result;
    }
    if (suppressed < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    if (suppressed) { /* as ``with``: the function then returns None */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return Py_NewRef(Py_None);
    }
    PyErr_Restore(type, value, tb);
    return NULL;
}

static PyObject *pcb_vectorcall(PikaCallback *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        /* not the call pika makes: the application's callback as it was called, untraced */
        return PyObject_Vectorcall(self->callback, args, nargsf, kwnames);
    }
    if (interned() < 0) {
        return NULL;
    }
    PyObject *impl = self->via_impl ? attr_or(args[0], s_impl, args[0], NULL) : Py_NewRef(args[0]);
    if (impl == NULL) {
        return NULL;
    }
    PyObject *cm = pika_consuming_of(impl, args[1], args[2]);
    Py_DECREF(impl);
    if (cm == NULL) {
        return NULL;
    }
    return call_within(cm, self->callback, args, (size_t)nargs);
}

static PyObject *pcb_mark(PikaCallback *self, void *closure) {
    Py_RETURN_TRUE;
}

static PyObject *pcb_wrapped(PikaCallback *self, void *closure) {
    return Py_NewRef(self->callback);
}

static PyGetSetDef pcb_getset[] = {
    {"__swmp_consumer__", (getter)pcb_mark, NULL, "True: a callback whose span is swmp's.", NULL},
    {"callback", (getter)pcb_wrapped, NULL, "The application's callback.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject swmp_PikaCallbackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.PikaCallback",
    .tp_basicsize = sizeof(PikaCallback),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PikaCallback(callback): callback(channel, method, properties, body) inside the message's entry span.",
    .tp_dealloc = (destructor)pcb_dealloc,
    .tp_traverse = (traverseproc)pcb_traverse,
    .tp_clear = (inquiry)pcb_clear,
    .tp_vectorcall_offset = offsetof(PikaCallback, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getset = pcb_getset,
};

PyObject *swmp_pika_callback(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    int via_impl = 1;
    if (nargs < 1 || nargs > 2 || !PyCallable_Check(args[0]) || (nargs == 2 && (via_impl = PyObject_IsTrue(args[1])) < 0)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "pika_callback(callback, via_impl=True): callback must be callable");
        }
        return NULL;
    }
    PikaCallback *self = PyObject_GC_New(PikaCallback, &swmp_PikaCallbackType);
    if (self == NULL) {
        return NULL;
    }
    self->callback = Py_NewRef(args[0]);
    self->vectorcall = (vectorcallfunc)pcb_vectorcall;
    self->via_impl = via_impl;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
