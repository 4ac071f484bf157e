/* The ping-pong workload of trace/workload.py in C, built with frame pointers, so that a
 * tracer's user stacks at each switch-out are whole and known: ping_loop or pong_loop, main,
 * the C library's start. Same arguments and output as the Python one:
 *   xhagent-pingpong ROUNDS [--pin none|same|split]
 * prints {"ping": PID, "pong": PID, "rounds": N, "pin": P, "elapsed_s": S}. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void pin_to(int nth)
{
	cpu_set_t allowed, one;
	int seen = 0;

	if (sched_getaffinity(0, sizeof(allowed), &allowed))
		die("sched_getaffinity");
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (!CPU_ISSET(cpu, &allowed) || seen++ < nth)
			continue;
		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		if (sched_setaffinity(0, sizeof(one), &one))
			die("sched_setaffinity");
		return;
	}
}

/* noinline: each is a frame of its own in the stacks */
__attribute__((noinline)) static void pong_loop(long rounds, int in, int out)
{
	char c;

	for (long i = 0; i < rounds; i++)
		if (read(in, &c, 1) != 1 || write(out, &c, 1) != 1)
			_exit(1);
}

__attribute__((noinline)) static void ping_loop(long rounds, int out, int in)
{
	char c = 'x';

	for (long i = 0; i < rounds; i++)
		if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1)
			die("pong process exited early");
}

int main(int argc, char **argv)
{
	const char *pin = "none";
	int a[2], b[2], status;
	struct timespec t0, t1;
	long rounds;
	pid_t pid;

	if (argc == 4 && !strcmp(argv[2], "--pin"))
		pin = argv[3];
	if ((argc != 2 && argc != 4) || (strcmp(pin, "none") && strcmp(pin, "same") &&
					 strcmp(pin, "split")) ||
	    (rounds = strtol(argv[1], NULL, 10)) <= 0) {
		fprintf(stderr, "usage: %s ROUNDS [--pin none|same|split]\n", argv[0]);
		return 2;
	}
	if (pipe(a) || pipe(b))
		die("pipe");
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		prctl(PR_SET_NAME, "xh-pong");
		if (strcmp(pin, "none"))
			pin_to(!strcmp(pin, "split"));
		pong_loop(rounds, a[0], b[1]);
		_exit(0);
	}
	prctl(PR_SET_NAME, "xh-ping");
	if (strcmp(pin, "none"))
		pin_to(0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ping_loop(rounds, a[1], b[0]);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		die("pong process failed");
	printf("{\"ping\": %d, \"pong\": %d, \"rounds\": %ld, \"pin\": \"%s\", \"elapsed_s\": %.6f}\n",
	       (int)getpid(), (int)pid, rounds, pin,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}
