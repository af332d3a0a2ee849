/* The native lane of lazymath's block pool (lazymath/_threads.py), x86-64 SysV, Linux.

   Built by tools/build_native_lane.py into the hex string _threads._LANE_CODE: position
   independent, no relocations, no libc (raw futex syscalls), so the bytes run wherever they are
   mapped. A native kernel's launch (`lane_launch`, called through ctypes with the GIL released)
   publishes the kernel's function, argv and block count; pool threads waiting in `lane_work`
   (also GIL-free) claim blocks with a compare-and-swap and call the kernel directly. No Python
   runs between the publish and the last block's end, so no thread waits for the GIL (a helper
   that woke in Python waited ~10 us for the GIL before its first block, and the launcher ~20 us
   after the last one).

   Layout (int64 words, the lane 64-byte aligned; each group on its own cache line):
     [0]  claim     gen << 32 | next block index; the index is CLOSED while a job is written
     [8]  done      (int32, futex word) blocks of the open job that have finished
     [9]  waiting   (int32) the launcher sleeps on `done`
     [16] fn, [17] argv, [18] n: the open job (written while the claim is closed)
     [24] seq       (int32, futex word) bumped by every publish: job, python bell, stop
     [25] sleepers  (int32) threads asleep on `seq`
     [26] pybell    bumped when the Python queue has a job (`lane_ring`)
     [27] stop      1: lane_work returns 0 (the pool shuts down)
   The claim protocol: the launcher closes the claim (gen+1, CLOSED), writes fn/argv/n and
   done = 0, then opens it (gen+1, 0). A claimer reads the claim, then the job, then CASes the
   claim to index + 1: the CAS succeeds only if the claim did not change since it was read, so
   the job it read is the one of that generation (a stale claimer's CAS fails once the claim is
   closed). The launcher returns only when done == n, so a job's fields are never rewritten
   while one of its blocks runs. */
#include <stdint.h>

typedef void (*kernel_fn)(int64_t, int64_t, void *);

#define CLOSED 0xffffffffLL
#define FUTEX_WAIT_PRIVATE 128
#define FUTEX_WAKE_PRIVATE 129
#define SC __ATOMIC_SEQ_CST
#define RLX __ATOMIC_RELAXED

struct lane {
    int64_t claim, pad0[7];
    int32_t done, waiting;
    int64_t pad1[7];
    int64_t fn, argv, n, pad2[5];
    int32_t seq, sleepers;
    int64_t pybell, stop, pad3[5];
};

static inline uint64_t tsc(void) { return __builtin_ia32_rdtsc(); }

static inline long futex(int32_t *addr, long op, long val) {
    long ret;
    register long r10 __asm__("r10") = 0; /* no timeout */
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(202L), "D"(addr), "S"(op), "d"(val), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

/* int64 spin(int64 *word, int64 seen, uint64 ticks): 1 as soon as *word != seen, 0 once `ticks`
   TSC ticks passed (the Python path's bounded spin). */
int64_t lane_spin(int64_t *word, int64_t seen, uint64_t ticks) {
    uint64_t t0 = tsc();
    for (;;) {
        if (__atomic_load_n(word, RLX) != seen) return 1;
        __builtin_ia32_pause();
        if (tsc() - t0 >= ticks) return 0; /* unsigned: a TSC step back ends the spin */
    }
}

uint64_t lane_tsc(void) { return tsc(); }

/* Claim and run blocks of generation `gen` until none is left. */
static void run_claims(struct lane *L, int64_t gen) {
    for (;;) {
        int64_t c = __atomic_load_n(&L->claim, SC);
        int64_t i = c & CLOSED;
        if ((c >> 32) != gen || i == CLOSED) return;
        kernel_fn fn = (kernel_fn)__atomic_load_n(&L->fn, SC);
        void *argv = (void *)__atomic_load_n(&L->argv, SC);
        int64_t n = __atomic_load_n(&L->n, SC);
        if (i >= n) return;
        if (!__atomic_compare_exchange_n(&L->claim, &c, c + 1, 0, SC, SC)) continue;
        fn(i, n, argv);
        if (__atomic_add_fetch(&L->done, 1, SC) == n && __atomic_load_n(&L->waiting, SC))
            futex(&L->done, FUTEX_WAKE_PRIVATE, 1);
    }
}

static void bump(struct lane *L) {
    __atomic_add_fetch(&L->seq, 1, SC);
    if (__atomic_load_n(&L->sleepers, SC)) futex(&L->seq, FUTEX_WAKE_PRIVATE, 0x7fffffff);
}

/* A pool thread's wait: run the blocks of every job published from now on; spin `ticks` TSC
   ticks after the last one, then sleep on `seq`. Returns 1 when the Python bell differs from
   `pyseen` (a job in the Python queue), 0 when the lane stops. */
int64_t lane_work(struct lane *L, uint64_t ticks, int64_t pyseen) {
    int64_t last = -1;
    uint64_t t0 = tsc();
    for (;;) {
        int32_t s = __atomic_load_n(&L->seq, SC);
        if (__atomic_load_n(&L->stop, SC)) return 0;
        if (__atomic_load_n(&L->pybell, SC) != pyseen) return 1;
        int64_t c = __atomic_load_n(&L->claim, SC);
        int64_t gen = c >> 32;
        if (gen != last && (c & CLOSED) != CLOSED) {
            run_claims(L, gen);
            last = gen;
            t0 = tsc();
            continue;
        }
        if (tsc() - t0 < ticks) {
            __builtin_ia32_pause();
            continue;
        }
        __atomic_add_fetch(&L->sleepers, 1, SC);
        futex(&L->seq, FUTEX_WAIT_PRIVATE, s); /* returns at once if seq moved on since `s` */
        __atomic_sub_fetch(&L->sleepers, 1, SC);
        t0 = tsc();
    }
}

/* Run `fn`'s `n` blocks on the calling thread and every pool thread in lane_work; returns when
   all have finished (spinning `ticks` TSC ticks for the helpers' last blocks, then sleeping). */
void lane_launch(struct lane *L, kernel_fn fn, void *argv, int64_t n, uint64_t ticks) {
    /* 31 bits of generation: gen << 32 stays positive, and wraps to 0 after 2^31 launches */
    int64_t gen = ((__atomic_load_n(&L->claim, SC) >> 32) + 1) & 0x7fffffff;
    __atomic_store_n(&L->claim, (gen << 32) | CLOSED, SC);
    __atomic_store_n(&L->fn, (int64_t)fn, SC);
    __atomic_store_n(&L->argv, (int64_t)argv, SC);
    __atomic_store_n(&L->n, n, SC);
    __atomic_store_n(&L->done, 0, SC);
    __atomic_store_n(&L->claim, gen << 32, SC);
    bump(L);
    run_claims(L, gen);
    uint64_t t0 = tsc();
    for (;;) {
        int32_t d = __atomic_load_n(&L->done, SC);
        if (d == n) break;
        if (tsc() - t0 < ticks) {
            __builtin_ia32_pause();
            continue;
        }
        __atomic_store_n(&L->waiting, 1, SC);
        if (__atomic_load_n(&L->done, SC) != n) futex(&L->done, FUTEX_WAIT_PRIVATE, d);
        __atomic_store_n(&L->waiting, 0, SC);
    }
}

/* A job was put on the Python queue: bump the bell, wake sleeping threads. */
void lane_ring(struct lane *L) {
    __atomic_add_fetch(&L->pybell, 1, SC);
    bump(L);
}

/* Stop (stop = 1) or re-arm (stop = 0) the lane; wakes every sleeping thread. */
void lane_stop(struct lane *L, int64_t stop) {
    __atomic_store_n(&L->stop, stop, SC);
    bump(L);
}
