/*
 * pdb_status.h - status codes of the base layer (0 OK, <0 errors).
 */
#ifndef PDB_STATUS_H
#define PDB_STATUS_H

typedef enum pdb_status {
    PDB_OK = 0,
    PDB_ERR_NOMEM = -1,     /* allocation failed */
    PDB_ERR_INVALID = -2,   /* bad argument */
    PDB_ERR_EXISTS = -3,    /* duplicate key */
    PDB_ERR_NOT_FOUND = -4, /* no such key */
    PDB_ERR_TOO_LARGE = -5, /* a buffer's limit would be exceeded */
} pdb_status_t;

/* Short static description of <st>; never NULL. */
const char *pdb_strerror(pdb_status_t st);

#endif /* PDB_STATUS_H */
