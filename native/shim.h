/* shim.h: the two ways xhagent-shim runs (shim.c: one workload; shim_serve.c: many). */
#ifndef XH_SHIM_H
#define XH_SHIM_H

/* Bytes a record file holds before its record is written over them: the most one record
 * holds, and the space reserved for it (shim.c's reserve_record; shim_spares.c). */
#define RECORD_SIZE 8192
/* The attempt directory a spare run directory holds: the first attempt's (shim_spares.c). */
#define SPARE_ATTEMPT "1"

/* Supervise the one workload `argv` names (the command line of shim.c's usage); returns
 * the shim's exit status, or exits with it. */
int shim_main(int argc, char **argv);

/* `xhagent-shim --serve [""...]`: start a supervisor per request on the socket at stdin
 * (shim_serve.c); returns once the agent closes its end. */
int shim_serve(int argc, char **argv);

/* `xhagent-shim --serve-at PATH`: the same, for the agents that connect to a socket it
 * listens on at PATH (shim_serve.c); returns only on an error. */
int shim_serve_at(int argc, char **argv);

/* `xhagent-shim --make-spares DIR --count N --keep-free BYTES`: spare run directories made
 * in DIR until it holds N (shim_spares.c), at the idle scheduling class; 0, or 1 with a
 * message on stderr. */
int shim_make_spares(int argc, char **argv);

#endif
