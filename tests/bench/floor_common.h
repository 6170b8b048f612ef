/*
 * floor_common.h - what mhd-floor and epoll-floor share: the fixed completion they answer, the
 * command line, and the stop flag their worker loops watch.
 */
#ifndef FLOOR_COMMON_H
#define FLOOR_COMMON_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLOOR_MAX_WORKERS 16

/* B1's answer, as the sim gives it (mhd_floor.sh answers the same from nginx). */
static const char FLOOR_REPLY[] =
    "{\"id\":\"cmpl-0\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"sim-"
    "model\","
    "\"choices\":[{\"index\":0,\"text\":\" a b c d e f g h i j k l m n o p\",\"logprobs\":null,"
    "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":16,"
    "\"total_tokens\":22}}";

static volatile sig_atomic_t floor_stop;

static void floor_on_signal(int sig)
{
    (void)sig;
    floor_stop = 1;
}

typedef struct floor_args {
    int port, workers;
    bool later; /* --mode <later_name>: answer on the loop's next turn */
} floor_args_t;

/* --port P [--workers N] [--mode direct|<later_name>]; false (usage printed) when invalid.
 * Installs the stop signals. */
static bool floor_parse(int argc, char **argv, const char *prog, const char *later_name,
                        floor_args_t *a)
{
    a->port = 0;
    a->workers = 2;
    a->later = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0)
            a->port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--workers") == 0)
            a->workers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--mode") == 0)
            a->later = strcmp(argv[i + 1], later_name) == 0;
    }
    if (a->port <= 0 || a->port > 65535 || a->workers < 1 || a->workers > FLOOR_MAX_WORKERS) {
        fprintf(stderr, "usage: %s --port P [--workers N] [--mode direct|%s]\n", prog, later_name);
        return false;
    }
    signal(SIGINT, floor_on_signal);
    signal(SIGTERM, floor_on_signal);
    return true;
}

#endif /* FLOOR_COMMON_H */
