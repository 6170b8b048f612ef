/*
 * pdtok_main.c - the `pdtok` binary: the library's command-line front end on its own.
 */
#include "pdtok/tokenizer.h"

int main(int argc, char **argv)
{
    return pdtok_cli_main(argc, argv);
}
