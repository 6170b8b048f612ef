/*
 * pdb_alloc.h - the one allocation wrapper of pdgw, with fault injection.
 *
 * Every library (gateway, scheduler, libkvt, forwarders, the simulator) and jansson allocate
 * through these, so a test can make the Nth allocation of the process fail and check that
 * every error path unwinds (curl's torture mode). The macros record the caller's file:line;
 * an injected failure names it on stderr when injection was asked for through the
 * environment, and pdb_alloc_last_failure() returns it.
 *
 * Environment (read once at start-up):
 *   PDB_ALLOC_FAIL=N          the Nth allocation of the process fails (1 = the first)
 *   PDB_ALLOC_FAIL_STICKY=1   ... and every later one too
 *   PDB_ALLOC_COUNT_FILE=path the number of allocations made is written there at exit
 *
 * Memory from these functions is plain malloc memory: pdb_free() is free(), so the two
 * may be mixed (libraries hand buffers to callers that free() them).
 */
#ifndef PDB_ALLOC_H
#define PDB_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void *pdb_malloc_at(size_t size, const char *file, int line);
void *pdb_calloc_at(size_t n, size_t size, const char *file, int line);
void *pdb_realloc_at(void *ptr, size_t size, const char *file, int line);
/* NULL <s> gives NULL (without counting an allocation). */
char *pdb_strdup_at(const char *s, const char *file, int line);
/* Copies at most <n> bytes and always NUL-terminates; NULL <s> gives NULL. */
char *pdb_strndup_at(const char *s, size_t n, const char *file, int line);
/* Zeroed, aligned to <align> (a power of two >= sizeof(void *)); free with pdb_free. */
void *pdb_aligned_calloc_at(size_t align, size_t size, const char *file, int line);
void pdb_free(void *ptr);

/* A size of 0 allocates 1 byte, so NULL always means failure. */
#define pdb_malloc(size)                pdb_malloc_at((size), __FILE__, __LINE__)
#define pdb_calloc(n, size)             pdb_calloc_at((n), (size), __FILE__, __LINE__)
#define pdb_realloc(ptr, size)          pdb_realloc_at((ptr), (size), __FILE__, __LINE__)
#define pdb_strdup(s)                   pdb_strdup_at((s), __FILE__, __LINE__)
#define pdb_strndup(s, n)               pdb_strndup_at((s), (n), __FILE__, __LINE__)
#define pdb_aligned_calloc(align, size) pdb_aligned_calloc_at((align), (size), __FILE__, __LINE__)

/*
 * Fault injection: the <n>th allocation from now (1 = the next one) fails, and every later
 * one too when <sticky> is non-zero. n = 0 disarms. Process-wide and thread-safe.
 */
void pdb_alloc_fail_at(uint64_t n, int sticky);
/* Allocations made (successful or not) since counting began: at start-up when the
 * environment arms injection (PDB_ALLOC_FAIL, PDB_ALLOC_COUNT_FILE), else at the first call of
 * this function or of pdb_alloc_fail_at (differences between two calls are exact). */
uint64_t pdb_alloc_count(void);
/*
 * Where the last injected failure happened: writes "file:line" into <buf> and returns the
 * number of the failed allocation, or 0 (buf = "") when none failed yet.
 */
uint64_t pdb_alloc_last_failure(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* PDB_ALLOC_H */
