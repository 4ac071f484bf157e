/* The ping-pong workload of trace/workload.py in C, built with frame pointers, so that a
 * tracer's user stacks at each switch-out are whole and known: ping_loop or pong_loop, main,
 * the C library's start. Same arguments and output as the Python one:
 *   xhagent-pingpong ROUNDS [--pin none|same|split] [--sleep-us N]
 * prints {"ping": PID, "pong": PID, "rounds": N, "pin": P, "elapsed_s": S}. With --sleep-us,
 * pong sleeps N us before each answer: blocks long beside a tracer's own time at a switch. */
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
__attribute__((noinline)) static void pong_loop(long rounds, int in, int out, long sleep_us)
{
	struct timespec nap = {.tv_sec = sleep_us / 1000000, .tv_nsec = sleep_us % 1000000 * 1000};
	char c;

	for (long i = 0; i < rounds; i++) {
		if (read(in, &c, 1) != 1)
			_exit(1);
		if (sleep_us)
			nanosleep(&nap, NULL);
		if (write(out, &c, 1) != 1)
			_exit(1);
	}
}

__attribute__((noinline)) static void ping_loop(long rounds, int out, int in)
{
	char c = 'x';

	for (long i = 0; i < rounds; i++)
		if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1)
			die("pong process exited early");
}

static int usage(const char *self)
{
	fprintf(stderr, "usage: %s ROUNDS [--pin none|same|split] [--sleep-us N]\n", self);
	return 2;
}

int main(int argc, char **argv)
{
	const char *pin = "none";
	long rounds, sleep_us = 0;
	int a[2], b[2], status;
	struct timespec t0, t1;
	char *end;
	pid_t pid;

	if (argc < 2 || (rounds = strtol(argv[1], &end, 10)) <= 0 || *end)
		return usage(argv[0]);
	for (int i = 2; i < argc; i += 2) {
		if (i + 1 >= argc)
			return usage(argv[0]);
		if (!strcmp(argv[i], "--pin"))
			pin = argv[i + 1];
		else if (!strcmp(argv[i], "--sleep-us") &&
			 ((sleep_us = strtol(argv[i + 1], &end, 10)) < 0 || *end))
			return usage(argv[0]);
		else if (strcmp(argv[i], "--sleep-us"))
			return usage(argv[0]);
	}
	if (strcmp(pin, "none") && strcmp(pin, "same") && strcmp(pin, "split"))
		return usage(argv[0]);
	if (pipe(a) || pipe(b))
		die("pipe");
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		prctl(PR_SET_NAME, "xh-pong");
		if (strcmp(pin, "none"))
			pin_to(!strcmp(pin, "split"));
		pong_loop(rounds, a[0], b[1], sleep_us);
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
