/*
 * pdtok_load_int.h - the loading stages shared by pdtok_load.c and pdtok_load_parts.c.
 */
#ifndef PDTOK_LOAD_INT_H
#define PDTOK_LOAD_INT_H

#include <jansson.h>

#include "pdtok_int.h"

/* normalizer, pre_tokenizer and decoder of <root> (borrowed). */
pdtok_status_t tok_load_parts(pdtok_t *tok, const json_t *root, char *err, size_t errlen);
/* post_processor (NULL or JSON null: none); needs the vocabulary and added tokens loaded. */
pdtok_status_t tok_load_post(pdtok_t *tok, const json_t *post, char *err, size_t errlen);

#endif /* PDTOK_LOAD_INT_H */
