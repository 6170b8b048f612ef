/*
 * pdgw-config-doc TABLE: print one reference table of gateway/CONFIG.md (keys, cli or
 * instances) from pdgw's option table. Run by gateway/tools/config_docs.py; not installed.
 */
#include <stdio.h>

#include "pdgw_config.h"

int main(int argc, char **argv)
{
    if (argc != 2 || pdgw_config_print_doc(stdout, argv[1]) != PDGW_OK) {
        fprintf(stderr, "usage: pdgw-config-doc keys|cli|instances\n");
        return 2;
    }
    return 0;
}
