/* shim.h: the two ways xhagent-shim runs (shim.c: one workload; shim_serve.c: many). */
#ifndef XH_SHIM_H
#define XH_SHIM_H

/* Supervise the one workload `argv` names (the command line of shim.c's usage); returns
 * the shim's exit status, or exits with it. */
int shim_main(int argc, char **argv);

/* `xhagent-shim --serve [""...]`: start a supervisor per request on the socket at stdin
 * (shim_serve.c); returns once the agent closes its end. */
int shim_serve(int argc, char **argv);

/* `xhagent-shim --serve-at PATH`: the same, for the agents that connect to a socket it
 * listens on at PATH (shim_serve.c); returns only on an error. */
int shim_serve_at(int argc, char **argv);

#endif
