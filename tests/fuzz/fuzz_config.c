/*
 * fuzz_config.c -- libFuzzer target for the libkvt configuration loaders:
 * the same bytes go to the YAML loader and the JSON loader. Either may
 * refuse; neither may crash, leak, or change the config when it refuses.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvt/kvt_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_config_t cfg, before;
    kvt_config_err_t err;

    kvt_config_defaults(&cfg);
    before = cfg;
    if (kvt_config_load_yaml_string(&cfg, (const char *)data, size, &err) != KVT_OK) {
        if (memcmp(&cfg, &before, sizeof(cfg)) != 0)
            abort();
    } else {
        (void)kvt_config_validate(&cfg, &err);
    }
    kvt_config_defaults(&cfg);
    if (kvt_config_load_json_string(&cfg, (const char *)data, size, &err) != KVT_OK) {
        if (memcmp(&cfg, &before, sizeof(cfg)) != 0)
            abort();
    }
    return 0;
}
