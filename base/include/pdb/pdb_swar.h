/*
 * pdb_swar.h - looking at eight bytes at once in a 64-bit word.
 *
 * Scanners of text (JSON strings, HTTP header values) mostly meet bytes they pass over; these
 * tests tell whether a word holds a byte that needs a look. Each sets bit 7 of a flagged
 * byte; a flag may also be set above the first truly flagged byte (a borrow spreads upwards),
 * never below it, so the lowest flag is always a true one and pdb_swar_first names it.
 */
#ifndef PDB_SWAR_H
#define PDB_SWAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PDB_SWAR_EACH(b) (0x0101010101010101ull * (uint8_t)(b))
#define PDB_SWAR_HIGH    PDB_SWAR_EACH(0x80)

/* The eight bytes at <p> as one word. */
static inline uint64_t pdb_swar_load(const void *p)
{
    uint64_t x;
    memcpy(&x, p, sizeof(x));
    return x;
}

/* Flags the bytes of <x> equal to <c>. */
static inline uint64_t pdb_swar_eq(uint64_t x, uint8_t c)
{
    uint64_t y = x ^ PDB_SWAR_EACH(c);
    return (y - PDB_SWAR_EACH(1)) & ~y & PDB_SWAR_HIGH;
}

/* Flags the bytes of <x> below <n> (n <= 128). */
static inline uint64_t pdb_swar_below(uint64_t x, uint8_t n)
{
    return (x - PDB_SWAR_EACH(n)) & ~x & PDB_SWAR_HIGH;
}

/* Flags the bytes of <x> from 0x80. */
static inline uint64_t pdb_swar_high(uint64_t x)
{
    return x & PDB_SWAR_HIGH;
}

/* The position (0-7, in memory order) of the first flagged byte of non-zero <flags>. */
static inline size_t pdb_swar_first(uint64_t flags)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (size_t)__builtin_clzll(flags) >> 3;
#else
    return (size_t)__builtin_ctzll(flags) >> 3;
#endif
}

#endif /* PDB_SWAR_H */
