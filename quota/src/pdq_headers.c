/*
 * pdq_headers.c - OpenAI's rate-limit response headers.
 *
 * Names and value shapes follow OpenAI's rate-limits guide ("Rate limits in headers"):
 * x-ratelimit-{limit,remaining,reset}-{requests,tokens}, the resets as durations such as
 * "1s", "6m0s" or "12ms" (Go's duration text). The requests headers describe the per-minute
 * budget (per-second when only that is set), the tokens headers the tokens-per-minute one;
 * of a tenant's and its model's budget the one with less left is shown.
 */
#include <string.h>

#include "pdq_int.h"

/* Decimal text of <v> at <p>; returns the end. Headers are built on every admission, and
 * snprintf was most of an admission's cost. */
static char *put_u64(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *put_str(char *p, const char *s)
{
    while (*s)
        *p++ = *s++;
    return p;
}

void pdq_duration_format(uint64_t ns, char *buf, size_t len)
{
    char tmp[48], *p = tmp;
    uint64_t ms = ns / PDB_NSEC_PER_MSEC + (ns % PDB_NSEC_PER_MSEC != 0);
    if (ms == 0) {
        p = put_str(p, "0s");
    } else if (ms < 1000) {
        p = put_str(put_u64(p, ms), "ms");
    } else {
        uint64_t h = ms / 3600000, m = ms / 60000 % 60, s = ms / 1000 % 60, frac = ms % 1000;
        if (h)
            p = put_str(put_u64(p, h), "h");
        if (h || m)
            p = put_str(put_u64(p, m), "m");
        p = put_u64(p, s);
        if (frac) {
            *p++ = '.';
            *p++ = (char)('0' + frac / 100);
            if (frac % 100) {
                *p++ = (char)('0' + frac / 10 % 10);
                if (frac % 10)
                    *p++ = (char)('0' + frac % 10);
            }
        }
        *p++ = 's';
    }
    size_t n = (size_t)(p - tmp);
    if (len == 0)
        return;
    if (n >= len)
        n = len - 1;
    memcpy(buf, tmp, n);
    buf[n] = '\0';
}

static void put(pdq_headers_t *h, const char *name, const char *value)
{
    if (h->n >= PDQ_MAX_HEADERS)
        return;
    size_t nl = strlen(name), vl = strlen(value);
    if (nl >= sizeof(h->h[0].name) || vl >= sizeof(h->h[0].value))
        return; /* never: names are ours, values are at most 20 digits */
    memcpy(h->h[h->n].name, name, nl + 1);
    memcpy(h->h[h->n].value, value, vl + 1);
    h->n++;
}

static void put_num(pdq_headers_t *h, const char *name, double v)
{
    char val[32];
    uint64_t u = v <= 0 ? 0 : v >= 1.8e19 ? UINT64_MAX : (uint64_t)(v + 0.5);
    *put_u64(val, u) = '\0';
    put(h, name, val);
}

/* Of the buckets <kinds> in the tenant's and the model's set, the one with least left. */
static const pdq_bucket_t *tightest(pdq_tenant_t *t, uint32_t model, const int *kinds, int nk,
                                    uint64_t now)
{
    const pdq_bucket_t *best = NULL;
    double best_left = 0;
    pdq_bset_t *sets[2] = {&t->budget, t->model_budget[model]};
    for (int s = 0; s < 2; s++)
        for (int i = 0; sets[s] && i < nk; i++) {
            const pdq_bucket_t *b = &sets[s]->b[kinds[i]];
            if (!pdq_bucket_on(b))
                continue;
            double left = pdq_bucket_remaining(b, now);
            if (best == NULL || left < best_left) {
                best = b;
                best_left = left;
            }
        }
    return best;
}

static void put_family(pdq_headers_t *h, bool requests, const pdq_bucket_t *b, uint64_t now)
{
    char val[32];
    put_num(h, requests ? "x-ratelimit-limit-requests" : "x-ratelimit-limit-tokens",
            b->leased ? b->cap : b->local_cap);
    put_num(h, requests ? "x-ratelimit-remaining-requests" : "x-ratelimit-remaining-tokens",
            pdq_bucket_remaining(b, now));
    pdq_duration_format(pdq_bucket_reset_ns(b, now), val, sizeof(val));
    put(h, requests ? "x-ratelimit-reset-requests" : "x-ratelimit-reset-tokens", val);
}

void pdq_headers_build(pdq_t *q, pdq_tenant_t *t, uint32_t model, uint64_t now, pdq_headers_t *out)
{
    (void)q;
    out->n = 0;
    static const int req_minute[] = {PDQ_B_RPM}, req_second[] = {PDQ_B_RPS};
    static const int tok[] = {PDQ_B_TPM};
    const pdq_bucket_t *r = tightest(t, model, req_minute, 1, now);
    if (r == NULL)
        r = tightest(t, model, req_second, 1, now);
    if (r)
        put_family(out, true, r, now);
    const pdq_bucket_t *k = tightest(t, model, tok, 1, now);
    if (k)
        put_family(out, false, k, now);
}

void pdq_headers_add_retry(pdq_headers_t *h, uint64_t retry_after_ms)
{
    /* Retry-After is whole seconds (RFC 9110), rounded up so a retry is never early;
     * retry-after-ms is the exact value, which OpenAI's SDKs prefer when present. */
    put_num(h, "retry-after", (double)((retry_after_ms + 999) / 1000));
    put_num(h, "retry-after-ms", (double)retry_after_ms);
}
