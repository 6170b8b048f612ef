/*
 * fuzz_pdgw_config.c - pdgw's own configuration: a YAML config file
 * (gateway/src/config/pdgw_config_yaml.c) when byte 0 is even, a command line
 * (gateway/src/config/pdgw_config_cli.c: flags generated from the option table,
 * then the cross-field check) when odd. For the command line the rest of the
 * input is NUL-separated arguments after argv[0] "pdgw"; the environment is
 * empty. Never a crash, over-read or leak; printing an accepted config works.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_config.h"

#define MAX_ARGS 32

static FILE *g_null;

static void yaml(const char *text, size_t len)
{
    pdgw_config_t cfg;
    pdgw_config_error_t err;
    pdgw_config_hooks_t hooks = {.out = g_null, .err = g_null};

    if (pdgw_config_init(&cfg) != PDGW_OK)
        abort();
    if (pdgw_config_load_yaml(&cfg, text, len, "fuzz.yaml", &err) == PDGW_OK &&
        pdgw_config_check(&cfg, &hooks, &err) == PDGW_OK)
        pdgw_config_print(&cfg, g_null);
    pdgw_config_free(&cfg);
}

static void cli(const char *text, size_t len)
{
    char *copy = malloc(len + 1), *argv[MAX_ARGS + 2], *envp[1] = {NULL};
    int argc = 0;
    size_t start = 0;
    pdgw_config_t cfg;
    pdgw_config_error_t err;
    pdgw_config_action_t action;
    pdgw_config_hooks_t hooks = {.out = g_null, .err = g_null};

    memcpy(copy, text, len);
    copy[len] = '\0';
    argv[argc++] = "pdgw";
    for (size_t i = 0; i <= len && argc <= MAX_ARGS; i++) {
        if (i == len || copy[i] == '\0') {
            argv[argc++] = copy + start;
            start = i + 1;
        }
    }
    argv[argc] = NULL;
    (void)pdgw_config_from_args(&cfg, argc, argv, envp, &hooks, &action, &err);
    pdgw_config_free(&cfg);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_null == NULL && (g_null = fopen("/dev/null", "w")) == NULL)
        abort();
    if (size == 0)
        return 0;
    if (data[0] & 1)
        cli((const char *)data + 1, size - 1);
    else
        yaml((const char *)data + 1, size - 1);
    return 0;
}
