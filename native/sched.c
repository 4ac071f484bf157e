/* sched.c: the hot path of one worker's scheduler (xhagent._sched), in C.
 *
 * `Core` is the base type of agent/runtime/scheduler.py's Scheduler. It holds the run
 * queues (per priority class: a binary heap of (deadline, seq, task) for EDF and a ring
 * buffer FIFO of deadline-less tasks), the running task (`current`), and the two calls
 * that every switch makes: `_next` (the scheduling decision) and `yield_` (go to the back
 * of one's class, pick the next, switch to it). A yield costs one C call and one greenlet
 * switch: no Python frame is pushed, nothing is allocated.
 *
 * The C path handles the common case only and hands everything else to the Python
 * scheduler: `_next` calls `self._next_slow()` when an instrument is installed, a task
 * crashed the run, another thread queued a wake-up (`_external`), or a timer is due; a
 * task picked for its first step gets its context from `self._bind(task)` (Python: the
 * context pool and its checked state transitions). The order is the scheduler's: class 0
 * first; in a class the deadline heap (earliest first, ties by the order they became
 * runnable) before the FIFO.
 *
 * Preemption's safe points: the SIGURG handler runs only between bytecodes, so never
 * inside this C code; while C calls back into Python (the scheduler's own methods) the
 * handler sees a frame of the runtime's files and does nothing. The clock is called from
 * here only when it is a builtin (time.monotonic); a Python clock goes the slow way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>

#include "greenlet.h"   /* greenlet's C API (its package ships the header): a direct switch */

typedef struct {
    double when;
    uint64_t seq;
    PyObject *task;
} hent;

typedef struct {
    PyObject **buf;     /* ring buffer, cap a power of two */
    Py_ssize_t cap, head, len;
    hent *heap;
    Py_ssize_t hlen, hcap;
} klass;

/* The fields of a task that the hot path reads and writes: TaskHandle's C base. */
typedef struct {
    PyObject_HEAD
    PyObject *g;        /* `_g`: its context's greenlet, None before its first step */
    char cancel;        /* `_cancel_requested` */
    char preempt;       /* `_preempt_requested` */
    PyObject *ctx;      /* `_ctx`: the Context it runs on (None while it holds none) */
    PyObject *coro;     /* `_coro`: an `async def` task's coroutine once started, else None */
    PyObject *local;    /* `_local`: its task-local storage while it waits without a context */
} TaskBase;

static PyTypeObject *TaskBaseType = NULL;
#define IS_TASK(o) PyObject_TypeCheck((o), TaskBaseType)
#define TB(o) ((TaskBase *)(o))

typedef struct {
    PyObject_HEAD
    PyObject *current;
    /* what _pick learnt of the task it picked (its class, deadline): a yield of that task
     * (still `current`) queues it without reading it */
    int cur_prio, cur_dl;
    double cur_when;
    PyObject *hub;
    PyObject *crash;
    PyObject *timers;
    PyObject *external;
    PyObject *clock;
    PyObject *free;      /* `_free`: the context pool's free list (a deque), most recent last */
    PyObject *pool;      /* `pool`: the ContextPool (its `reused` count) */
    PyObject *instrumented;   /* `_instrumented`: True when an instrument has hooks */
    PyObject *cur_task;       /* the task cur_* describe (held, so its address stays its) */
    /* A context offered by a coroutine task that yields (borrowed, set only around that
     * pick): a picked task that holds none (fresh, or a coroutine that handed its own on)
     * takes it over instead of binding one; `offered` says it was taken. */
    PyObject *offer_ctx, *offer_g;
    int offered;
    int classes;
    klass *q;
    uint64_t seq;
} Core;

static PyObject *one = NULL;
static PyObject *s_append, *s_state_attr, *s_task, *s_greenlet, *s_reused, *s_pop;
static PyObject *CTX_IDLE = NULL, *CTX_RUNNING = NULL, *CTX_REUSED = NULL;   /* ContextState */
static PyObject *s_priority, *s_deadline, *s_state, *s_switch,
    *s_bind, *s_next_slow, *s_ctx_wait_park;
static PyObject *Cancelled = NULL;   /* task.Cancelled, given by configure() */
static PyObject *TrapType = NULL, *YIELD = NULL;   /* task.Trap and api's yield trap */
static PyObject *F_RUNNING = NULL;   /* concurrent.futures' RUNNING state string */
static PyObject *s_fn, *s_args, *s_local, *s_throw, *s_value;
static PyObject *PENDING = NULL;     /* concurrent.futures' PENDING state string */
static Core *running = NULL;         /* the scheduler running in this process */

/* -- the queues ---------------------------------------------------------------------- */
static int fifo_push(klass *k, PyObject *task) {
    if (k->len == k->cap) {
        Py_ssize_t ncap = k->cap ? k->cap * 2 : 64;
        PyObject **nb = PyMem_Malloc(ncap * sizeof(PyObject *));
        if (!nb) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < k->len; i++)
            nb[i] = k->buf[(k->head + i) & (k->cap - 1)];
        PyMem_Free(k->buf);
        k->buf = nb;
        k->cap = ncap;
        k->head = 0;
    }
    Py_INCREF(task);
    k->buf[(k->head + k->len) & (k->cap - 1)] = task;
    k->len++;
    return 0;
}

static PyObject *fifo_pop(klass *k) {   /* a new reference; k->len > 0 */
    PyObject *t = k->buf[k->head];
    k->head = (k->head + 1) & (k->cap - 1);
    k->len--;
    return t;
}

static inline int hless(const hent *a, const hent *b) {
    return a->when < b->when || (a->when == b->when && a->seq < b->seq);
}

static int heap_push(klass *k, double when, uint64_t seq, PyObject *task) {
    if (k->hlen == k->hcap) {
        Py_ssize_t ncap = k->hcap ? k->hcap * 2 : 16;
        hent *nh = PyMem_Realloc(k->heap, ncap * sizeof(hent));
        if (!nh) {
            PyErr_NoMemory();
            return -1;
        }
        k->heap = nh;
        k->hcap = ncap;
    }
    Py_INCREF(task);
    Py_ssize_t i = k->hlen++;
    hent e = {when, seq, task};
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!hless(&e, &k->heap[p]))
            break;
        k->heap[i] = k->heap[p];
        i = p;
    }
    k->heap[i] = e;
    return 0;
}

static PyObject *heap_pop(klass *k) {   /* a new reference; k->hlen > 0 */
    PyObject *top = k->heap[0].task;
    hent last = k->heap[--k->hlen];
    Py_ssize_t i = 0, n = k->hlen;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hless(&k->heap[c + 1], &k->heap[c]))
            c++;
        if (!hless(&k->heap[c], &last))
            break;
        k->heap[i] = k->heap[c];
        i = c;
    }
    if (n)
        k->heap[i] = last;
    return top;
}

/* Queue `task` in its class: EDF heap if it has a deadline, else the FIFO. */
static int core_ready(Core *s, PyObject *task) {
    if (!IS_TASK(task)) {
        PyErr_Format(PyExc_TypeError, "run queues take tasks (TaskBase), not %R", Py_TYPE(task));
        return -1;
    }
    PyObject *p = PyObject_GetAttr(task, s_priority);
    if (!p)
        return -1;
    long prio = PyLong_AsLong(p);
    Py_DECREF(p);
    if (prio == -1 && PyErr_Occurred())
        return -1;
    if (prio < 0 || prio >= s->classes) {
        PyErr_Format(PyExc_ValueError, "priority class %ld is not in 0..%d", prio, s->classes - 1);
        return -1;
    }
    klass *k = &s->q[prio];
    PyObject *d = PyObject_GetAttr(task, s_deadline);
    if (!d)
        return -1;
    if (d == Py_None) {
        Py_DECREF(d);
        return fifo_push(k, task);
    }
    double when = PyFloat_AsDouble(d);
    Py_DECREF(d);
    if (when == -1.0 && PyErr_Occurred())
        return -1;
    return heap_push(k, when, s->seq++, task);
}

/* -- the decision -------------------------------------------------------------------- */
/* Scheduler._bind's common case: a free context (most recently released first) whose state
 * is Idle or Reused moves to Running, bound to `task`; its greenlet (a new reference). NULL
 * with no error set: not the common case (no free context, another state), so the Python
 * _bind decides (it grows the pool, or raises the illegal transition). */
static PyObject *core_bind_fast(Core *s, PyObject *task) {
    if (!s->free || s->free == Py_None || !s->pool || !CTX_RUNNING)
        return NULL;
    Py_ssize_t n = PyObject_Size(s->free);
    if (n <= 0) {
        if (n < 0)
            PyErr_Clear();
        return NULL;
    }
    PyObject *ctx = PyObject_CallMethodNoArgs(s->free, s_pop);
    if (!ctx)
        return NULL;
    PyObject *g = NULL;
    PyObject *state = PyObject_GetAttr(ctx, s_state_attr);
    if (!state)
        goto fail;
    int reused = state == CTX_REUSED;
    int idle = state == CTX_IDLE;
    Py_DECREF(state);
    if (!reused && !idle) {   /* back where it was: the Python _bind raises the illegal move */
        PyObject *r = PyObject_CallMethodOneArg(s->free, s_append, ctx);
        Py_DECREF(ctx);
        Py_XDECREF(r);
        return NULL;   /* an error if the append failed, else none: Python decides */
    }
    if (reused) {
        PyObject *count = PyObject_GetAttr(s->pool, s_reused);
        if (!count)
            goto fail;
        PyObject *more = PyNumber_Add(count, one);
        Py_DECREF(count);
        if (!more)
            goto fail;
        int rc = PyObject_SetAttr(s->pool, s_reused, more);
        Py_DECREF(more);
        if (rc < 0)
            goto fail;
    }
    if (PyObject_SetAttr(ctx, s_state_attr, CTX_RUNNING) < 0 ||
        PyObject_SetAttr(ctx, s_task, task) < 0)
        goto fail;
    Py_INCREF(ctx);
    Py_XSETREF(TB(task)->ctx, ctx);
    g = PyObject_GetAttr(ctx, s_greenlet);
    if (!g)
        goto fail;
    Py_INCREF(g);
    Py_XSETREF(TB(task)->g, g);
    Py_DECREF(ctx);
    return g;
fail:
    Py_DECREF(ctx);
    return NULL;
}

/* A yielding coroutine task's context, taken over by `task`, which holds none: its
 * greenlet (a new reference). The context stays Running; no release, no bind. */
static PyObject *take_offer(Core *s, PyObject *task) {
    PyObject *ctx = s->offer_ctx, *g = s->offer_g;
    if (PyObject_SetAttr(ctx, s_task, task) < 0)
        return NULL;
    Py_XSETREF(TB(task)->ctx, Py_NewRef(ctx));
    s->offer_ctx = s->offer_g = NULL;
    s->offered = 1;
    Py_INCREF(g);
    Py_XSETREF(TB(task)->g, g);
    Py_INCREF(g);
    return g;
}

/* The greenlet to run next (a new reference): the first runnable task's, or the hub's. */
static PyObject *core_pick(Core *s) {
    for (int c = 0; c < s->classes; c++) {
        klass *k = &s->q[c];
        while (k->hlen || k->len) {
            int dl = k->hlen != 0;
            double when = dl ? k->heap[0].when : 0.0;
            PyObject *task = dl ? heap_pop(k) : fifo_pop(k);
            PyObject *g = TB(task)->g;
            if (g && g != Py_None) {
                Py_INCREF(g);
            } else {   /* its first step, or a coroutine's next after it handed its context on */
                if (TB(task)->coro == Py_None) {
                    PyObject *st = PyObject_GetAttr(task, s_state);
                    if (!st) {
                        Py_DECREF(task);
                        return NULL;
                    }
                    int pending = st == PENDING;
                    Py_DECREF(st);
                    if (!pending) {   /* cancelled before it started: its entry was left behind */
                        Py_DECREF(task);
                        continue;
                    }
                }
                g = s->offer_ctx ? take_offer(s, task) : core_bind_fast(s, task);
                if (!g && !PyErr_Occurred())
                    g = PyObject_CallMethodOneArg((PyObject *)s, s_bind, task);
                if (!g) {
                    Py_DECREF(task);
                    return NULL;
                }
                if (g == Py_None) {   /* the pool is at its max: the task waits for a context */
                    Py_DECREF(g);
                    PyObject *r = PyObject_CallMethodOneArg((PyObject *)s, s_ctx_wait_park, task);
                    Py_DECREF(task);
                    if (!r)
                        return NULL;
                    Py_DECREF(r);
                    continue;
                }
            }
            Py_INCREF(task);
            Py_XSETREF(s->cur_task, task);
            Py_SETREF(s->current, task);
            s->cur_prio = c;
            s->cur_dl = dl;
            s->cur_when = when;
            return g;
        }
    }
    Py_INCREF(Py_None);
    Py_SETREF(s->current, Py_None);
    Py_INCREF(s->hub);
    return s->hub;
}

/* Anything that needs the Python scheduler before the queues are looked at? */
static int core_needs_slow(Core *s) {
    if (s->instrumented != Py_False || s->crash != Py_None)
        return 1;
    if (s->external != Py_None) {
        Py_ssize_t n = PyObject_Size(s->external);
        if (n != 0)
            return n < 0 ? -1 : 1;
    }
    if (s->timers != Py_None && PyList_Check(s->timers) && PyList_GET_SIZE(s->timers)) {
        if (!PyCFunction_Check(s->clock))
            return 1;   /* a Python clock is called from Python frames only (safe points) */
        PyObject *first = PyList_GET_ITEM(s->timers, 0);
        if (!PyList_Check(first) || PyList_GET_SIZE(first) < 1)
            return 1;
        double when = PyFloat_AsDouble(PyList_GET_ITEM(first, 0));
        if (when == -1.0 && PyErr_Occurred())
            return -1;
        PyObject *now_o = PyObject_CallNoArgs(s->clock);
        if (!now_o)
            return -1;
        double now = PyFloat_AsDouble(now_o);
        Py_DECREF(now_o);
        if (now == -1.0 && PyErr_Occurred())
            return -1;
        return when <= now;
    }
    return 0;
}

static PyObject *core_next_impl(Core *s) {
    int slow = core_needs_slow(s);
    if (slow < 0)
        return NULL;
    if (slow)
        return PyObject_CallMethodNoArgs((PyObject *)s, s_next_slow);
    return core_pick(s);
}

static PyObject *empty_tuple = NULL;

static int switch_to(PyObject *g) {
    /* greenlet's own entry, not the `switch` method: no lookup, no call machinery, and a
     * shallower C stack, which greenlet copies out and back in at every switch */
    PyObject *r = PyGreenlet_Check(g) ? PyGreenlet_Switch((PyGreenlet *)g, empty_tuple, NULL)
                                      : PyObject_CallMethodNoArgs(g, s_switch);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *raise_cancelled(void) {   /* NULL, with Cancelled raised */
    PyErr_SetNone(Cancelled ? Cancelled : PyExc_RuntimeError);
    return NULL;
}

/* The back of its class for the running task (_ready, knowing its class and deadline from
 * _pick when it is the task _pick made current). */
static int requeue(Core *s, PyObject *task) {
    if (task == s->cur_task) {
        klass *k = &s->q[s->cur_prio];
        return s->cur_dl ? heap_push(k, s->cur_when, s->seq++, task) : fifo_push(k, task);
    }
    return core_ready(s, task);
}

static PyObject *core_yield_impl(Core *s) {
    PyObject *task = s->current;
    if (task == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "yield_ is called only inside a task");
        return NULL;
    }
    if (!IS_TASK(task)) {
        PyErr_SetString(PyExc_TypeError, "the current task is not a TaskBase");
        return NULL;
    }
    if (TB(task)->cancel)
        return raise_cancelled();
    TB(task)->preempt = 0;   /* a yield is what a pending preemption asked for */
    Py_INCREF(task);
    PyObject *nxt = NULL, *me = TB(task)->g;   /* the caller's greenlet: none else runs it */
    Py_XINCREF(me);
    if (requeue(s, task) < 0)
        goto fail;
    nxt = core_next_impl(s);
    if (!nxt)
        goto fail;
    if (nxt != me && switch_to(nxt) < 0)
        goto fail;
    Py_CLEAR(nxt);
    Py_XDECREF(me);
    int cancelled = TB(task)->cancel;
    Py_DECREF(task);
    if (cancelled)
        return raise_cancelled();
    Py_RETURN_NONE;
fail:
    Py_XDECREF(nxt);
    Py_XDECREF(me);
    Py_DECREF(task);
    return NULL;
}


/* -- coroutine tasks ----------------------------------------------------------------- */
static PyObject *new_cancelled(void) {
    return PyObject_CallNoArgs(Cancelled ? Cancelled : PyExc_RuntimeError);
}

/* The exception now set, as an instance, cleared (3.11: no PyErr_GetRaisedException). */
static PyObject *fetch_exception(void) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

/* coro.throw(exc): like PyIter_Send, a StopIteration raised is the coroutine's return. */
static PySendResult throw_into(PyObject *coro, PyObject *exc, PyObject **out) {
    *out = PyObject_CallMethodOneArg(coro, s_throw, exc);
    if (*out)
        return PYGEN_NEXT;
    if (!PyErr_ExceptionMatches(PyExc_StopIteration))
        return PYGEN_ERROR;
    PyObject *stop = fetch_exception();
    *out = stop ? PyObject_GetAttr(stop, s_value) : NULL;
    Py_XDECREF(stop);
    return *out ? PYGEN_RETURN : PYGEN_ERROR;
}

/* ctx's task waits without it (its storage kept with it); `nxt`, which took it over, gets
 * its own storage back in the context. */
static int hand_on(PyObject *ctx, PyObject *task, PyObject *nxt) {
    Py_XSETREF(TB(task)->g, Py_NewRef(Py_None));
    Py_XSETREF(TB(task)->ctx, Py_NewRef(Py_None));
    PyObject *local = PyObject_GetAttr(ctx, s_local);
    if (!local)
        return -1;
    int kept = PyDict_Check(local) && PyDict_GET_SIZE(local) > 0;
    if (kept)
        Py_XSETREF(TB(task)->local, local);
    else
        Py_DECREF(local);
    PyObject *theirs = TB(nxt)->local;
    if (theirs != Py_None) {
        TB(nxt)->local = Py_NewRef(Py_None);
        int rc = PyObject_SetAttr(ctx, s_local, theirs);
        Py_DECREF(theirs);
        return rc;
    }
    if (!kept)
        return 0;
    PyObject *fresh = PyDict_New();
    if (!fresh)
        return -1;
    int rc = PyObject_SetAttr(ctx, s_local, fresh);
    Py_DECREF(fresh);
    return rc;
}

/* _drive(ctx): run the task bound to `ctx` (an `async def` task whose coroutine is in
 * `_coro`) until a task ends on this context; its result, or its exception raised. Each
 * Trap it awaits is a runtime call made here on its behalf. At a yield (`YIELD`) it goes
 * to the back of its class and, when the task picked next holds no context (a fresh task,
 * or a coroutine task that handed its own on), hands this context over to it and waits
 * without one: the next step runs here, with no greenlet switch and no stack copied. The
 * task that ends may so be another than the one the call began with: `ctx.task`. */
static PyObject *core_drive(Core *s, PyObject *ctx) {
    PyObject *me = PyObject_GetAttr(ctx, s_greenlet);
    if (!me)
        return NULL;
    PyObject *task = PyObject_GetAttr(ctx, s_task);
    if (!task) {
        Py_DECREF(me);
        return NULL;
    }
    PyObject *value = Py_NewRef(Py_None), *exc = NULL, *out = NULL;
    if (!IS_TASK(task) || TB(task)->coro == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "_drive: the context's task has no coroutine");
        goto fail;
    }
    if (TB(task)->cancel && !(exc = new_cancelled()))
        goto fail;
    for (;;) {
        PyObject *coro = Py_NewRef(TB(task)->coro);
        PySendResult r;
        if (exc) {
            r = throw_into(coro, exc, &out);
            Py_CLEAR(exc);
        } else {
            r = PyIter_Send(coro, value, &out);
        }
        Py_DECREF(coro);
        Py_CLEAR(value);
        if (r == PYGEN_RETURN)
            goto done;
        if (r == PYGEN_ERROR)
            goto fail;
        if (out == YIELD) {
            Py_CLEAR(out);
            if (TB(task)->cancel) {
                if (!(exc = new_cancelled()))
                    goto fail;
                continue;
            }
            TB(task)->preempt = 0;   /* a yield is what a pending preemption asked for */
            if (requeue(s, task) < 0)
                goto fail;
            s->offer_ctx = ctx;
            s->offer_g = me;
            s->offered = 0;
            PyObject *nxt = core_next_impl(s);
            s->offer_ctx = s->offer_g = NULL;
            if (!nxt) {
                s->offered = 0;
                goto fail;
            }
            if (s->offered) {   /* `current` took this context over: run it here */
                s->offered = 0;
                Py_DECREF(nxt);
                PyObject *taker = Py_NewRef(s->current);
                if (hand_on(ctx, task, taker) < 0) {
                    Py_DECREF(taker);
                    goto fail;
                }
                Py_SETREF(task, taker);
                if (TB(task)->coro == Py_None) {   /* its first step */
                    if (PyObject_SetAttr(task, s_state, F_RUNNING) < 0)
                        goto fail;
                    PyObject *fn = PyObject_GetAttr(task, s_fn);
                    PyObject *args = fn ? PyObject_GetAttr(task, s_args) : NULL;
                    out = args ? PyObject_Call(fn, args, NULL) : NULL;
                    Py_XDECREF(fn);
                    Py_XDECREF(args);
                    if (!out)
                        goto fail;
                    if (!PyCoro_CheckExact(out))
                        goto done;   /* a plain function task, run to its end here */
                    Py_XSETREF(TB(task)->coro, out);
                    out = NULL;
                }
            } else {   /* this task keeps the context; back when it is picked again */
                int rc = nxt == me ? 0 : switch_to(nxt);
                Py_DECREF(nxt);
                if (rc < 0) {   /* handed to the coroutine (its `finally`), as from a Trap */
                    if (!(exc = fetch_exception()))
                        goto fail;
                    continue;
                }
            }
            if (TB(task)->cancel && !(exc = new_cancelled()))
                goto fail;
            value = Py_NewRef(Py_None);
            continue;
        }
        if (Py_TYPE(out) != (PyTypeObject *)TrapType) {
            PyErr_Format(PyExc_TypeError, "runtime tasks can await only runtime awaitables, not %R",
                         out);
            Py_CLEAR(out);
            if (!(exc = fetch_exception()))
                goto fail;
            continue;
        }
        /* a blocking runtime call (sleep, join, a read): made here, parking this context */
        PyObject *fn = PyObject_GetAttr(out, s_fn);
        PyObject *args = fn ? PyObject_GetAttr(out, s_args) : NULL;
        Py_CLEAR(out);
        value = args ? PyObject_Call(fn, args, NULL) : NULL;
        Py_XDECREF(fn);
        Py_XDECREF(args);
        if (!value && !(exc = fetch_exception()))   /* handed to the coroutine */
            goto fail;
    }
done:
    Py_DECREF(me);
    Py_DECREF(task);
    return out;
fail:
    Py_XDECREF(value);
    Py_XDECREF(exc);
    Py_XDECREF(out);
    Py_DECREF(me);
    Py_DECREF(task);
    return NULL;
}

/* -- the type ------------------------------------------------------------------------ */
static int core_alloc_queues(Core *s, int classes) {
    klass *q = PyMem_Calloc(classes, sizeof(klass));
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    s->q = q;
    s->classes = classes;
    return 0;
}

static void core_clear_queues(Core *s) {
    if (!s->q)
        return;
    klass *q = s->q;
    int n = s->classes;
    s->q = NULL;
    for (int c = 0; c < n; c++) {
        klass *k = &q[c];
        while (k->len) {
            PyObject *t = fifo_pop(k);
            Py_DECREF(t);
        }
        while (k->hlen) {
            PyObject *t = k->heap[--k->hlen].task;
            Py_DECREF(t);
        }
        PyMem_Free(k->buf);
        PyMem_Free(k->heap);
    }
    PyMem_Free(q);
}

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    (void)args;
    (void)kw;
    Core *s = (Core *)type->tp_alloc(type, 0);
    if (!s)
        return NULL;
    s->current = Py_NewRef(Py_None);
    s->hub = Py_NewRef(Py_None);
    s->crash = Py_NewRef(Py_None);
    s->timers = Py_NewRef(Py_None);
    s->external = Py_NewRef(Py_None);
    s->clock = Py_NewRef(Py_None);
    s->free = Py_NewRef(Py_None);
    s->pool = Py_NewRef(Py_None);
    s->instrumented = Py_NewRef(Py_False);
    s->cur_task = Py_NewRef(Py_None);
    return (PyObject *)s;
}

static int core_traverse(Core *s, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->current);
    Py_VISIT(s->hub);
    Py_VISIT(s->crash);
    Py_VISIT(s->timers);
    Py_VISIT(s->external);
    Py_VISIT(s->clock);
    Py_VISIT(s->free);
    Py_VISIT(s->pool);
    Py_VISIT(s->instrumented);
    Py_VISIT(s->cur_task);
    if (s->q) {
        for (int c = 0; c < s->classes; c++) {
            klass *k = &s->q[c];
            for (Py_ssize_t i = 0; i < k->len; i++)
                Py_VISIT(k->buf[(k->head + i) & (k->cap - 1)]);
            for (Py_ssize_t i = 0; i < k->hlen; i++)
                Py_VISIT(k->heap[i].task);
        }
    }
    return 0;
}

static int core_clear(Core *s) {
    core_clear_queues(s);
    Py_CLEAR(s->current);
    Py_CLEAR(s->hub);
    Py_CLEAR(s->crash);
    Py_CLEAR(s->timers);
    Py_CLEAR(s->external);
    Py_CLEAR(s->clock);
    Py_CLEAR(s->free);
    Py_CLEAR(s->pool);
    Py_CLEAR(s->instrumented);
    Py_CLEAR(s->cur_task);
    return 0;
}

static void core_dealloc(Core *s) {
    PyTypeObject *tp = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    if (running == s)
        running = NULL;   /* cannot happen while it is held there; kept for safety */
    core_clear(s);
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

static PyObject *m_setup_queues(Core *s, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "need 1..1024 priority classes, not %ld", n);
        return NULL;
    }
    core_clear_queues(s);
    if (core_alloc_queues(s, (int)n) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int need_queues(Core *s) {
    if (!s->q) {
        PyErr_SetString(PyExc_RuntimeError, "scheduler core: queues not set up");
        return -1;
    }
    return 0;
}

static PyObject *m_ready(Core *s, PyObject *task) {
    if (need_queues(s) < 0 || core_ready(s, task) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* _push(task, priority, deadline): _ready with the two fields given (a spawn has them in
 * hand, checked), not read back from the task. */
static PyObject *m_push(Core *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_push(task, priority, deadline)");
        return NULL;
    }
    if (need_queues(s) < 0)
        return NULL;
    PyObject *task = args[0];
    if (!IS_TASK(task)) {
        PyErr_Format(PyExc_TypeError, "run queues take tasks (TaskBase), not %R", Py_TYPE(task));
        return NULL;
    }
    long prio = PyLong_AsLong(args[1]);
    if (prio == -1 && PyErr_Occurred())
        return NULL;
    if (prio < 0 || prio >= s->classes) {
        PyErr_Format(PyExc_ValueError, "priority class %ld is not in 0..%d", prio, s->classes - 1);
        return NULL;
    }
    klass *k = &s->q[prio];
    int rc;
    if (args[2] == Py_None) {
        rc = fifo_push(k, task);
    } else {
        double when = PyFloat_AsDouble(args[2]);
        if (when == -1.0 && PyErr_Occurred())
            return NULL;
        rc = heap_push(k, when, s->seq++, task);
    }
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *m_pick(Core *s, PyObject *noarg) {
    (void)noarg;
    if (need_queues(s) < 0)
        return NULL;
    return core_pick(s);
}

static PyObject *m_next(Core *s, PyObject *noarg) {
    (void)noarg;
    if (need_queues(s) < 0)
        return NULL;
    return core_next_impl(s);
}

static PyObject *m_yield(Core *s, PyObject *noarg) {
    (void)noarg;
    if (need_queues(s) < 0)
        return NULL;
    return core_yield_impl(s);
}

static PyObject *m_drive(Core *s, PyObject *ctx) {
    if (need_queues(s) < 0)
        return NULL;
    if (!TrapType || !YIELD || !F_RUNNING) {
        PyErr_SetString(PyExc_RuntimeError, "scheduler core: configure_coro() not called");
        return NULL;
    }
    Py_INCREF(s);
    Py_INCREF(ctx);
    PyObject *r = core_drive(s, ctx);
    Py_DECREF(ctx);
    Py_DECREF(s);
    return r;
}

static PyObject *m_runnable_class(Core *s, PyObject *noarg) {
    (void)noarg;
    for (int c = 0; s->q && c < s->classes; c++)
        if (s->q[c].len || s->q[c].hlen)
            return PyLong_FromLong(c);
    Py_RETURN_NONE;
}

static PyObject *m_queued(Core *s, PyObject *noarg) {
    (void)noarg;
    Py_ssize_t n = 0;
    for (int c = 0; s->q && c < s->classes; c++)
        n += s->q[c].len + s->q[c].hlen;
    return PyLong_FromSsize_t(n);
}

static PyMethodDef core_methods[] = {
    {"_setup_queues", (PyCFunction)m_setup_queues, METH_O, "make `n` empty priority classes"},
    {"_ready", (PyCFunction)m_ready, METH_O, "queue a task at the back of its class (EDF heap or FIFO)"},
    {"_push", (PyCFunction)(void (*)(void))m_push, METH_FASTCALL,
     "_push(task, priority, deadline): _ready with its class and deadline given"},
    {"_pick", (PyCFunction)m_pick, METH_NOARGS,
     "pop the most urgent runnable task, make it current; its greenlet (the hub's if none)"},
    {"_next", (PyCFunction)m_next, METH_NOARGS,
     "the scheduling decision: _next_slow() when hooks, a crash, outside wake-ups or a due "
     "timer need Python, else _pick()"},
    {"yield_", (PyCFunction)m_yield, METH_NOARGS,
     "go to the back of this task's class; raises Cancelled if it was cancelled"},
    {"_drive", (PyCFunction)m_drive, METH_O,
     "_drive(ctx): run ctx's coroutine task (and those it hands ctx to at yields) until a "
     "task ends on ctx; its result"},
    {"runnable_class", (PyCFunction)m_runnable_class, METH_NOARGS,
     "the most urgent class with a runnable task (None when none is)"},
    {"_queued", (PyCFunction)m_queued, METH_NOARGS, "entries in the run queues"},
    {NULL, NULL, 0, NULL},
};

/* T_OBJECT_EX, never NULL after core_new: CPython 3.11 specializes attribute access to
 * such slots (LOAD_ATTR_SLOT), so the Python half of the scheduler reads them cheaply. */
static PyMemberDef core_members[] = {
    {"current", T_OBJECT_EX, offsetof(Core, current), 0, "the running task (None in the hub)"},
    {"_hub", T_OBJECT_EX, offsetof(Core, hub), 0, NULL},
    {"_crash", T_OBJECT_EX, offsetof(Core, crash), 0, NULL},
    {"_timers", T_OBJECT_EX, offsetof(Core, timers), 0, NULL},
    {"_external", T_OBJECT_EX, offsetof(Core, external), 0, NULL},
    {"clock", T_OBJECT_EX, offsetof(Core, clock), 0, NULL},
    {"_free", T_OBJECT_EX, offsetof(Core, free), 0, "the context pool's free list"},
    {"pool", T_OBJECT_EX, offsetof(Core, pool), 0, "the ContextPool"},
    {"_instrumented", T_OBJECT_EX, offsetof(Core, instrumented), 0, NULL},
    {"_nclasses", T_INT, offsetof(Core, classes), READONLY, "priority classes (C's count)"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "The C part of a worker's scheduler: run queues, current task, _next, yield_."},
    {Py_tp_new, core_new},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {0, NULL},
};

static PyType_Spec core_spec = {
    "xhagent._sched.Core",
    sizeof(Core),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    core_slots,
};

/* -- TaskBase ---------------------------------------------------------------------- */
static int task_traverse(TaskBase *t, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(t));
    Py_VISIT(t->g);
    Py_VISIT(t->ctx);
    Py_VISIT(t->coro);
    Py_VISIT(t->local);
    return 0;
}

static int task_clear(TaskBase *t) {
    Py_CLEAR(t->g);
    Py_CLEAR(t->ctx);
    Py_CLEAR(t->coro);
    Py_CLEAR(t->local);
    return 0;
}

static void task_dealloc(TaskBase *t) {
    PyTypeObject *tp = Py_TYPE(t);
    PyObject_GC_UnTrack(t);
    Py_CLEAR(t->g);
    Py_CLEAR(t->ctx);
    Py_CLEAR(t->coro);
    Py_CLEAR(t->local);
    tp->tp_free((PyObject *)t);
    Py_DECREF(tp);
}

/* object.__new__'s allocation, which also sets up the instance's inline attribute values
 * (the key table its class shares, TaskHandle's fields): PyType_GenericNew does not, and
 * every task would get a dict of its own at its first attribute write. */
static PyObject *task_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    (void)args;
    (void)kw;
    PyObject *t = PyBaseObject_Type.tp_new(type, empty_tuple, NULL);
    if (t) {   /* T_OBJECT_EX, never NULL: see core_members */
        TB(t)->g = Py_NewRef(Py_None);
        TB(t)->ctx = Py_NewRef(Py_None);
        TB(t)->coro = Py_NewRef(Py_None);
        TB(t)->local = Py_NewRef(Py_None);
    }
    return t;
}

static PyMemberDef task_members[] = {
    {"_g", T_OBJECT_EX, offsetof(TaskBase, g), 0,
     "its context's greenlet (None before its first step and after its end)"},
    {"_cancel_requested", T_BOOL, offsetof(TaskBase, cancel), 0, NULL},
    {"_preempt_requested", T_BOOL, offsetof(TaskBase, preempt), 0, NULL},
    {"_ctx", T_OBJECT_EX, offsetof(TaskBase, ctx), 0,
     "the Context it runs on (None before its first step, after its end, and while a "
     "coroutine task waits without one)"},
    {"_coro", T_OBJECT_EX, offsetof(TaskBase, coro), 0,
     "an async def task's coroutine once it has started (None: not started, or not one)"},
    {"_local", T_OBJECT_EX, offsetof(TaskBase, local), 0,
     "its task-local storage while it waits without a context (None otherwise)"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot task_slots[] = {
    {Py_tp_doc, "The fields of a task that the scheduler's C path uses (TaskHandle's base)."},
    {Py_tp_new, task_new},
    {Py_tp_dealloc, task_dealloc},
    {Py_tp_traverse, task_traverse},
    {Py_tp_clear, task_clear},
    {Py_tp_members, task_members},
    {0, NULL},
};

static PyType_Spec task_spec = {
    "xhagent._sched.TaskBase",
    sizeof(TaskBase),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    task_slots,
};

/* -- YieldAwait: what `await yield_async()` awaits --------------------------------------- */
/* An awaitable that is its own iterator and yields YIELD once: no generator and no frame
 * per await, as a Python `__await__` would make. */
typedef struct {
    PyObject_HEAD
    char done;
} YieldAwait;

static PyTypeObject *YieldAwaitType = NULL;

static PyObject *ya_self(PyObject *self) {
    return Py_NewRef(self);
}

static PyObject *ya_next(YieldAwait *y) {
    if (y->done)
        return NULL;   /* exhausted, no exception: the await's value is None */
    y->done = 1;
    return Py_NewRef(YIELD ? YIELD : Py_None);
}

static void ya_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot ya_slots[] = {
    {Py_tp_doc, "await-able once: yields the scheduler's YIELD trap (yield_async())"},
    {Py_am_await, ya_self},
    {Py_tp_iter, ya_self},
    {Py_tp_iternext, ya_next},
    {Py_tp_dealloc, ya_dealloc},
    {0, NULL},
};

static PyType_Spec ya_spec = {
    "xhagent._sched.YieldAwait", sizeof(YieldAwait), 0, Py_TPFLAGS_DEFAULT, ya_slots,
};

static PyObject *f_yield_async(PyObject *mod, PyObject *noarg) {
    (void)mod;
    (void)noarg;
    if (!YIELD) {
        PyErr_SetString(PyExc_RuntimeError, "scheduler core: configure_coro() not called");
        return NULL;
    }
    YieldAwait *y = PyObject_New(YieldAwait, YieldAwaitType);
    if (y)
        y->done = 0;
    return (PyObject *)y;
}

/* -- InlineRead: a task's small read, answered inside its own io_uring_enter ------------- */
/* runtime.io's fast path for `rt.read(fd, n <= SLOT, offset)`: the inline try of
 * TaskRing._now (the same xh_rt_now of xhagent._uring, called through its address) with
 * the slot on top of the free list as its user_data, made straight into the bytes object
 * the task gets (fresh, seen by nobody until it is filled: one copy, the kernel's). When
 * the page cache answered it inside the enter and nothing else completed, that object is
 * returned, with no Python frame. Anything else goes back to Python: None when nothing was
 * tried (no task, a cancelled one, the wrong thread, a backlog, no free slot, a full SQ,
 * arguments for the checks there), (slot, others, buffer) when the try was made and did
 * not end alone (TaskRing._landed finishes it; the buffer stays the kernel's until its
 * completion). The SIGURG handler runs between bytecodes only, so nothing can interleave
 * with the try. */
typedef int (*rt_now_fn)(void *ring, int opcode, int fd, char *buf, uint64_t buf_off,
                         unsigned len, uint64_t offset, uint64_t user_data, int64_t *res,
                         int64_t *out, unsigned max);

typedef struct {
    PyObject_HEAD
    rt_now_fn now;
    void *ring;             /* NULL once closed */
    int64_t *res, *out;
    unsigned max, slot;
    PyObject *free, *backlog;   /* the TaskRing's lists */
    unsigned long thread;
    unsigned long long reads;   /* reads answered here, whole */
} InlineRead;

static int ir_init(InlineRead *r, PyObject *args, PyObject *kw) {
    unsigned long long now, ring, res, out;
    unsigned max, slot;
    PyObject *free, *backlog;
    (void)kw;
    if (!PyArg_ParseTuple(args, "KKKKIIO!O!", &now, &ring, &res, &out, &max, &slot,
                          &PyList_Type, &free, &PyList_Type, &backlog))
        return -1;
    r->now = (rt_now_fn)(uintptr_t)now;
    r->ring = (void *)(uintptr_t)ring;
    r->res = (int64_t *)(uintptr_t)res;
    r->out = (int64_t *)(uintptr_t)out;
    r->max = max;
    r->slot = slot;
    Py_XSETREF(r->free, Py_NewRef(free));
    Py_XSETREF(r->backlog, Py_NewRef(backlog));
    r->thread = PyThread_get_thread_ident();
    return 0;
}

static int ir_arg(PyObject *o, long long lo, long long hi, long long *v) {
    int overflow;
    if (!PyLong_CheckExact(o))
        return 0;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && *v >= lo && *v <= hi;
}

static PyObject *ir_read(InlineRead *r, PyObject *const *args, Py_ssize_t nargs) {
    long long fd, nbytes, offset;
    Py_ssize_t nfree;
    Core *s = running;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "read(fd, nbytes, offset)");
        return NULL;
    }
    if (!r->ring || !s || !s->current || !IS_TASK(s->current) || TB(s->current)->cancel ||
        PyThread_get_thread_ident() != r->thread || PyList_GET_SIZE(r->backlog) ||
        !(nfree = PyList_GET_SIZE(r->free)) || !ir_arg(args[0], 0, INT32_MAX, &fd) ||
        !ir_arg(args[1], 0, r->slot, &nbytes) || !ir_arg(args[2], 0, INT64_MAX, &offset))
        Py_RETURN_NONE;
    long i = PyLong_AsLong(PyList_GET_ITEM(r->free, nfree - 1));
    if (i < 0 || (unsigned long)i >= r->max) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)nbytes);
    if (!data)
        return NULL;
    int n = r->now(r->ring, 0 /* XH_OP_READ */, (int)fd, PyBytes_AS_STRING(data), 0,
                   (unsigned)nbytes, (uint64_t)offset, (uint64_t)i, r->res, r->out, r->max);
    if (n == -EBUSY) {   /* no SQE: nothing was queued */
        Py_DECREF(data);
        Py_RETURN_NONE;
    }
    int64_t got = *r->res;
    if (n == 0 && got >= 0) {
        r->reads++;
        if (got < nbytes && _PyBytes_Resize(&data, (Py_ssize_t)got) < 0)
            return NULL;
        return data;
    }
    return Py_BuildValue("(liN)", i, n, data);
}

static PyObject *ir_close(InlineRead *r, PyObject *noarg) {
    (void)noarg;
    r->ring = NULL;
    Py_RETURN_NONE;
}

static PyObject *ir_reads(InlineRead *r, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(r->reads);
}

static int ir_traverse(InlineRead *r, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(r));
    Py_VISIT(r->free);
    Py_VISIT(r->backlog);
    return 0;
}

static int ir_clear(InlineRead *r) {
    Py_CLEAR(r->free);
    Py_CLEAR(r->backlog);
    r->ring = NULL;
    return 0;
}

static void ir_dealloc(InlineRead *r) {
    PyTypeObject *tp = Py_TYPE(r);
    PyObject_GC_UnTrack(r);
    ir_clear(r);
    tp->tp_free((PyObject *)r);
    Py_DECREF(tp);
}

static PyMethodDef ir_methods[] = {
    {"read", (PyCFunction)(void (*)(void))ir_read, METH_FASTCALL,
     "read(fd, nbytes, offset): bytes, None (not tried) or (slot, others, buffer) (tried, "
     "not ended alone)"},
    {"close", (PyCFunction)ir_close, METH_NOARGS, "the ring is closing: try nothing more"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ir_getset[] = {
    {"reads", (getter)ir_reads, NULL, "reads answered here, whole", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ir_slots[] = {
    {Py_tp_doc, "InlineRead(xh_rt_now, ring, res, out, max, slot, free, backlog): the fast "
                "path of a task's small read (see runtime.io)"},
    {Py_tp_init, ir_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, ir_methods},
    {Py_tp_getset, ir_getset},
    {Py_tp_traverse, ir_traverse},
    {Py_tp_clear, ir_clear},
    {Py_tp_dealloc, ir_dealloc},
    {0, NULL},
};

static PyType_Spec ir_spec = {
    "xhagent._sched.InlineRead", sizeof(InlineRead), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, ir_slots,
};

/* -- module functions ---------------------------------------------------------------- */
static PyObject *f_set_running(PyObject *mod, PyObject *arg) {
    (void)mod;
    if (arg == Py_None) {
        Py_CLEAR(running);
        Py_RETURN_NONE;
    }
    PyObject *core_type = PyObject_GetAttrString(mod, "Core");
    if (!core_type)
        return NULL;
    int ok = PyObject_TypeCheck(arg, (PyTypeObject *)core_type);
    Py_DECREF(core_type);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "set_running takes a Core (or None)");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XSETREF(running, (Core *)arg);
    Py_RETURN_NONE;
}

static PyObject *f_yield(PyObject *mod, PyObject *noarg) {
    (void)mod;
    (void)noarg;
    Core *s = running;
    if (!s) {
        PyErr_SetString(PyExc_RuntimeError, "no runtime scheduler is running");
        return NULL;
    }
    Py_INCREF(s);   /* the run may end (and drop it) while this task is switched out */
    PyObject *r = s->q ? core_yield_impl(s) : (need_queues(s), NULL);
    Py_DECREF(s);
    return r;
}

static PyObject *f_configure(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *cancelled, *pending, *idle = NULL, *run = NULL, *reused = NULL;
    if (!PyArg_ParseTuple(args, "OO|OOO", &cancelled, &pending, &idle, &run, &reused))
        return NULL;
    if (idle && run && reused) {
        Py_XSETREF(CTX_IDLE, Py_NewRef(idle));
        Py_XSETREF(CTX_RUNNING, Py_NewRef(run));
        Py_XSETREF(CTX_REUSED, Py_NewRef(reused));
    }
    Py_INCREF(cancelled);
    Py_XSETREF(Cancelled, cancelled);
    Py_INCREF(pending);
    Py_XSETREF(PENDING, pending);
    Py_RETURN_NONE;
}

static PyObject *f_configure_coro(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *trap, *yield_trap, *running_state;
    if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &trap, &yield_trap, &running_state))
        return NULL;
    Py_XSETREF(TrapType, Py_NewRef(trap));
    Py_XSETREF(YIELD, Py_NewRef(yield_trap));
    Py_XSETREF(F_RUNNING, Py_NewRef(running_state));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_running", f_set_running, METH_O, "the Core that yield_() acts on (None: none)"},
    {"yield_", f_yield, METH_NOARGS,
     "the running scheduler's yield_: back of this task's class, the next one runs"},
    {"configure", f_configure, METH_VARARGS,
     "configure(Cancelled, PENDING[, IDLE, RUNNING, REUSED]): the exception a cancelled task "
     "gets, the fresh-task state, the context states a bind moves between"},
    {"yield_async", f_yield_async, METH_NOARGS,
     "`await yield_async()` in an async def task: a yield (its YIELD trap, no generator made)"},
    {"configure_coro", f_configure_coro, METH_VARARGS,
     "configure_coro(Trap, YIELD, RUNNING): what coroutine tasks await, the trap that is a "
     "yield, the started-task state"},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
#define INTERN(var, text)                                    \
    if (!(var = PyUnicode_InternFromString(text)))           \
        return -1;
    INTERN(s_priority, "priority");
    INTERN(s_state_attr, "state");
    INTERN(s_append, "append");
    if (!(one = PyLong_FromLong(1)))
        return -1;
    INTERN(s_task, "task");
    INTERN(s_greenlet, "greenlet");
    INTERN(s_reused, "reused");
    INTERN(s_pop, "pop");
    INTERN(s_deadline, "deadline");
    INTERN(s_state, "_state");
    INTERN(s_switch, "switch");
    INTERN(s_bind, "_bind");
    INTERN(s_next_slow, "_next_slow");
    INTERN(s_ctx_wait_park, "_wait_for_context");
    INTERN(s_fn, "fn");
    INTERN(s_args, "args");
    INTERN(s_local, "local");
    INTERN(s_throw, "throw");
    INTERN(s_value, "value");
#undef INTERN
    if (!(empty_tuple = PyTuple_New(0)))
        return -1;
    PyGreenlet_Import();
    if (!_PyGreenlet_API)
        return -1;
    PyObject *tb = PyType_FromModuleAndSpec(m, &task_spec, NULL);
    if (!tb)
        return -1;
    TaskBaseType = (PyTypeObject *)tb;   /* kept: the module lives as long as the process */
    Py_INCREF(tb);
    if (PyModule_AddObject(m, "TaskBase", tb) < 0) {
        Py_DECREF(tb);
        return -1;
    }
    PyObject *ya = PyType_FromModuleAndSpec(m, &ya_spec, NULL);
    if (!ya)
        return -1;
    YieldAwaitType = (PyTypeObject *)ya;   /* kept, as TaskBase */
    Py_INCREF(ya);
    if (PyModule_AddObject(m, "YieldAwait", ya) < 0) {
        Py_DECREF(ya);
        return -1;
    }
    PyObject *ir = PyType_FromModuleAndSpec(m, &ir_spec, NULL);
    if (!ir)
        return -1;
    if (PyModule_AddObject(m, "InlineRead", ir) < 0) {
        Py_DECREF(ir);
        return -1;
    }
    PyObject *t = PyType_FromModuleAndSpec(m, &core_spec, NULL);
    if (!t)
        return -1;
    if (PyModule_AddObject(m, "Core", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "xhagent._sched",
    "The scheduler's hot path in C: run queues, the pick, yield_.", 0, module_methods,
    module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sched(void) {
    return PyModuleDef_Init(&moduledef);
}
