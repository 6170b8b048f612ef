/*
 * Slicing: a transfer's page list (as local/remote segments) becomes work
 * requests of at most slice_size bytes (64 KiB by default). A slice never
 * crosses an MR boundary on either side, so each one is a single SGE with one
 * lkey and one rkey. Slices are posted as chains (wr.next) so one ibv_post_send
 * hands the device a whole batch.
 */
#include <string.h>

#include "kvt_verbs_int.h"

size_t kvt_verbs_seg_coalesce(kvt_verbs_seg_t *segs, size_t nsegs)
{
    size_t w = 0;

    for (size_t r = 0; r < nsegs; r++) {
        if (segs[r].len == 0)
            continue;
        if (w > 0 && segs[w - 1].laddr + segs[w - 1].len == segs[r].laddr &&
            segs[w - 1].raddr + segs[w - 1].len == segs[r].raddr &&
            segs[w - 1].lmap == segs[r].lmap && segs[w - 1].rmap == segs[r].rmap &&
            segs[w - 1].len + segs[r].len > segs[w - 1].len) {
            segs[w - 1].len += segs[r].len;
            continue;
        }
        segs[w++] = segs[r];
    }
    return w;
}

/* Walk the segments, calling back (when out != NULL) with every slice. */
static kvt_status_t slice_walk(const kvt_verbs_seg_t *segs, size_t nsegs, uint32_t slice_size,
                               uint8_t opcode, kvt_verbs_slice_t *out, size_t cap, size_t *nout)
{
    size_t n = 0;

    if (slice_size == 0)
        return KVT_ERR_INVALID;
    for (size_t i = 0; i < nsegs; i++) {
        uint64_t done = 0;

        while (done < segs[i].len) {
            uint64_t la = segs[i].laddr + done, ra = segs[i].raddr + done;
            uint64_t want = segs[i].len - done, lleft, rleft;
            uint32_t lkey, rkey;
            kvt_status_t st;

            st = kvt_verbs_mr_map_lookup(segs[i].lmap, la, want, &lkey, &lleft);
            if (st != KVT_OK)
                return KVT_ERR_BOUNDS;
            st = kvt_verbs_mr_map_lookup(segs[i].rmap, ra, want, &rkey, &rleft);
            if (st != KVT_OK)
                return KVT_ERR_BOUNDS;
            if (want > slice_size)
                want = slice_size;
            if (want > lleft)
                want = lleft;
            if (want > rleft)
                want = rleft;
            if (out != NULL) {
                if (n >= cap)
                    return KVT_ERR_INVALID;
                memset(&out[n], 0, sizeof(out[n]));
                out[n].laddr = la;
                out[n].raddr = ra;
                out[n].lkey = lkey;
                out[n].rkey = rkey;
                out[n].len = (uint32_t)want;
                out[n].opcode = opcode;
                out[n].state = KVT_VERBS_SLICE_QUEUED;
                out[n].qp = -1;
            }
            n++;
            done += want;
        }
    }
    *nout = n;
    return KVT_OK;
}

kvt_status_t kvt_verbs_slice_count(const kvt_verbs_seg_t *segs, size_t nsegs, uint32_t slice_size,
                                   size_t *count)
{
    return slice_walk(segs, nsegs, slice_size, 0, NULL, 0, count);
}

kvt_status_t kvt_verbs_slice_build(const kvt_verbs_seg_t *segs, size_t nsegs, uint32_t slice_size,
                                   uint8_t opcode, kvt_verbs_slice_t *out, size_t cap, size_t *nout)
{
    if (out == NULL)
        return KVT_ERR_INVALID;
    return slice_walk(segs, nsegs, slice_size, opcode, out, cap, nout);
}

void kvt_verbs_chain_build(kvt_verbs_slice_t *const *s, size_t n, struct ibv_send_wr *wrs,
                           struct ibv_sge *sges)
{
    for (size_t i = 0; i < n; i++) {
        memset(&wrs[i], 0, sizeof(wrs[i]));
        sges[i].addr = s[i]->laddr;
        sges[i].length = s[i]->len;
        sges[i].lkey = s[i]->lkey;
        wrs[i].wr_id = (uint64_t)(uintptr_t)s[i];
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].opcode = (enum ibv_wr_opcode)s[i]->opcode;
        /* Every WR is signalled: each slice's completion drives its retry
         * bookkeeping. */
        wrs[i].send_flags = IBV_SEND_SIGNALED;
        wrs[i].wr.rdma.remote_addr = s[i]->raddr;
        wrs[i].wr.rdma.rkey = s[i]->rkey;
        wrs[i].next = (i + 1 < n) ? &wrs[i + 1] : NULL;
    }
}
