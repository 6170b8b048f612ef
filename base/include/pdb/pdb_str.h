/*
 * pdb_str.h - joining short strings into a fixed buffer without a format string: header
 * lines, URLs and ids are built on every request, and snprintf's format walk costs more than
 * the copy.
 */
#ifndef PDB_STR_H
#define PDB_STR_H

#include <stddef.h>

/* <a> then <b> into <dst> (size > 0), cut to size - 1 bytes and NUL-terminated; the length
 * the whole join has (as snprintf returns it: >= size means it was cut). */
size_t pdb_str_join(char *dst, size_t size, const char *a, const char *b);

#endif /* PDB_STR_H */
