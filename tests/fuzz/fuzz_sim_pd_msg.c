/*
 * fuzz_sim_pd_msg.c - the simulator's KV side channel (tests/sim/
 * sim_pd_kvt.c): one JSON frame from a decode instance into the prefill's
 * handler (handle_ctl: pull / register / cancel, receiver validation) when
 * byte 0 is even, or a prefill's reply into the decode's handler
 * (handle_reply) when odd. The file is included so its static handlers can
 * be driven without the KV thread; replies go to a NULL socket and are
 * dropped. "compute" frames are skipped: they start a simulated request on
 * the engine, which is not running here.
 *
 * Never a crash, over-read or leak.
 */
#include "sim_pd_kvt.c"

static void drop_regs(void)
{
    while (regs != NULL) {
        reg_t *r = regs;
        regs = r->next;
        free(r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t ident[] = "fuzz-decode";
    const char *text = (const char *)data + 1;
    size_t len;

    if (size == 0)
        return 0;
    len = size - 1;
    if (data[0] & 1) {
        handle_reply(text, len);
        return 0;
    }
    {
        json_t *m = json_loadb(text, len, 0, NULL);
        const char *op = json_string_value(json_object_get(m, "op"));
        int compute = op != NULL && strcmp(op, "compute") == 0;
        json_decref(m);
        if (compute)
            return 0;
    }
    handle_ctl(ident, sizeof(ident) - 1, text, len);
    drop_regs();
    return 0;
}
