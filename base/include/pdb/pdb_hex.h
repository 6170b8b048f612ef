/*
 * pdb_hex.h - one hexadecimal digit's value, for the text forms pdgw and libkvt read (UUIDs,
 * byte strings in JSON messages, verbs GIDs, JSON \u escapes).
 */
#ifndef PDB_HEX_H
#define PDB_HEX_H

/* 0..15, or -1 when <c> is not a hexadecimal digit (either case). */
static inline int pdb_hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif /* PDB_HEX_H */
