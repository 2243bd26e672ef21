// -- held: a block per SM looping over rows past 8192, each row's w in shared memory -------
//
// Past TALL_VOCAB a row's w, m and v no longer fit one SM, so every update reads m and v
// from memory and writes them back. The stream kernels also read w three times (max, sum,
// update) and write it: 32 bytes per parameter-update. Here a block keeps as much of its
// row's w as the launch's dynamic shared memory holds (a row of 52224 floats on sm_90; the
// driver reports the size in %dynamic_smem_size) and runs all of the launch's updates of
// the row in turn (the plan gives these kernels up to 32 updates a launch), so w comes
// from memory once per launch and goes back once: 16 bytes per parameter-update. Quads
// past that capacity are read from memory in each pass, as the stream kernels read them.
// What shared memory is left keeps the sum's exponentials for the update. An update's max
// is taken from the w the update before it wrote (HELD_RUNNING_MAX), so only a launch's
// first update of a row has a pass of its own for the max.
//
// The grid is one block per SM (the plan target's multiprocessors); block b takes rows b,
// b + gridDim.x, ... While it writes a row's last update (or its finish), each thread
// copies the next row's held quads into the slots it has finished with (cp.async), so the
// next row's first pass finds w in shared memory. Any grid gives the same bits.
//
// Thread t takes the quad at position p = 4 HELD_THREADS r + 4 t in round r (the row's
// element p - skew, below): the max and the update are elementwise, so any mapping gives
// their bits. A lane-order fold (the row sum, the
// corpus weight sum and loss) is one chain per tree lane l over j = l + 256 n, so each
// round's values are staged in shared memory by element and the first 256 threads fold
// their HELD_FOLD of the round in order, two rounds' buffers alternating so one barrier a
// round suffices. The max is the integer max of order keys over the block, or the literal
// lane-order tree when it is a zero (its sign is the lane order's).
//
// Tuning macros change speed, never bits (dev/cuda/bench_stream.py --variants):
// - HELD_THREADS: 512 (128 registers), 768 (80: the kernels spill but with
//   HELD_KEEP_EXPONENTIALS 0, HELD_DEPTH 2, HELD_UPDATE_DEPTH 1, HELD_RUNNING_MAX 0 and
//   HELD_PREFETCH_CHUNK 6144, a round's m in two chunks as at 512 rather than three) or
//   1024 (64: both kernels spill but with HELD_FAST_DIVIDE 0, HELD_DEPTH 2,
//   HELD_UPDATE_DEPTH 1, HELD_KEEP_EXPONENTIALS 0 and HELD_RUNNING_MAX 0, and the corpus
//   one even so) threads per block; the plan launches the block the image's launch bounds
//   name (signatures.BLOCK_FROM_IMAGE). HELD_BLOCKS: blocks per SM the bounds plan
//   registers for.
// - HELD_DEPTH: rounds of w loads in flight per thread while the row is first read.
// - HELD_UPDATE_DEPTH: rounds of m and v (and corpus weights) loads in flight in the update.
// - HELD_KEEP_EXPONENTIALS: the shared memory past the held w keeps the first exponentials
//   of the sum for the update (1), or the update computes them all again (0).
// - HELD_FAST_DIVIDE: a quad's divisions and roots issued together (adamw_together) (1), or
//   element by element (0).
// - HELD_L2_PREFETCH: eighths of the row's m and v (of its positions, from its aligned
//   base) the block asks into the L2 cache as it begins an update of the row
//   (cp.async.bulk.prefetch, sm_90), so memory works during the max and the sum and the
//   update finds them in L2; 0: none.
// - HELD_L2_PREFETCH_EACH: HELD_L2_PREFETCH asks at every update of the row (1), or only at
//   the launch's first (0).
// - HELD_RUNNING_MAX: the update keeps each thread's max of the w it writes, and the next
//   pass (update or finish) takes the block's max of those (the same keyed max, the same
//   fallback to the lane-order tree for a zero) instead of reading the row again (1); or
//   each pass reads the row for its max (0). The max of a set of values is the same whoever
//   folds it: only a zero's sign depends on the order, and a zero takes the tree.
// - HELD_W_LIMIT: hold at most this many of a row's w in shared memory (the rest is read
//   from memory in each pass; the room freed keeps more exponentials). Unlimited by default.
// - HELD_L2_AHEAD: the update asks L2 for the m and v of the round this many rounds ahead
//   of the one it reads (past those HELD_L2_PREFETCH asked for); 0: none.
// - HELD_PREFETCH_CHUNK: the bytes one thread asks into L2 at a time (a multiple of 16
//   that divides a round's 16 HELD_THREADS bytes of m).
#ifndef HELD_THREADS
#define HELD_THREADS 512u
#endif
#define HELD_ROUND (4u * HELD_THREADS)  // elements per round: one quad per thread
#define HELD_WARPS (HELD_THREADS / WARP)
#define HELD_FOLD (HELD_ROUND / LANES)  // a tree lane's elements in one round
#ifndef HELD_DEPTH
#define HELD_DEPTH 4u
#endif
#ifndef HELD_UPDATE_DEPTH
#define HELD_UPDATE_DEPTH 2u
#endif
#ifndef HELD_KEEP_EXPONENTIALS
#define HELD_KEEP_EXPONENTIALS 1
#endif
#ifndef HELD_FAST_DIVIDE
#define HELD_FAST_DIVIDE 1
#endif
#ifndef HELD_L2_PREFETCH
#define HELD_L2_PREFETCH 1u
#endif
#ifndef HELD_RUNNING_MAX
#define HELD_RUNNING_MAX 1
#endif
#ifndef HELD_W_LIMIT
#define HELD_W_LIMIT 0xFFFFFFFFu
#endif
#ifndef HELD_L2_PREFETCH_EACH
#define HELD_L2_PREFETCH_EACH 1
#endif
#ifndef HELD_L2_AHEAD
#define HELD_L2_AHEAD 2u
#endif
#ifndef HELD_PREFETCH_CHUNK
#define HELD_PREFETCH_CHUNK 4096u  // bytes one thread asks into L2 at a time
#endif
#ifndef HELD_BLOCKS
#define HELD_BLOCKS 1u  // blocks per SM the launch bounds ask registers for
#endif
#define HELD_BOUNDS __launch_bounds__(HELD_THREADS, HELD_BLOCKS)

struct __align__(16) HeldShared {
    float4 staged[2][HELD_THREADS];  // a round's fold values by element, rounds alternating
    float scalars[2 * HELD_THREADS];  // StagedScalars
    float partials[LANES];
    int keys[HELD_WARPS];  // each warp's max key
    float result;
};

// The launch's dynamic shared memory in bytes (the CUDA driver, and Bob's nv driver area at
// c[0x0][0x2c], put it where this special register reads).
static __device__ __forceinline__ u32 dynamic_shared_bytes() {
    u32 bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// A quad copied from memory into shared memory behind the thread's back (cp.async), and
// the wait for all of this thread's copies.
static __device__ __forceinline__ void copy_quad_in(float4* to, const float* from) {
    const u32 address = (u32)__cvta_generic_to_shared(to);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(address), "l"(from)
                 : "memory");
}

// Ask the L2 cache to fetch `bytes` (a multiple of 16) from 16-byte aligned memory: no
// registers, no shared memory, nothing to wait for (sm_90; elsewhere nothing).
static __device__ __forceinline__ void prefetch_into_l2(const float* from, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" : : "l"(from), "r"(bytes)
                 : "memory");
#endif
}

// The bytes of a row's m (and of its v) HELD_L2_PREFETCH asks for as an update of the row
// begins: its first HELD_L2_PREFETCH eighths of its positions (below: from its aligned
// base), a multiple of 16.
static __device__ __forceinline__ u32 first_asked_bytes(u32 end) {
    return end * 4u / 8u * HELD_L2_PREFETCH / 16u * 16u;
}

// This row's m and v from their aligned bases, their first HELD_L2_PREFETCH eighths, asked
// into L2 in chunks, one chunk per thread. `end`: one past the row's last position.
static __device__ __forceinline__ void prefetch_moments(const float* m, const float* v,
                                                        u32 end) {
    const u32 bytes = first_asked_bytes(end);
    const u32 chunks = (bytes + HELD_PREFETCH_CHUNK - 1u) / HELD_PREFETCH_CHUNK;
    for (u32 c = threadIdx.x; c < 2u * chunks; c += HELD_THREADS) {
        const u32 offset = (c % chunks) * HELD_PREFETCH_CHUNK;
        const u32 size = ::min(HELD_PREFETCH_CHUNK, bytes - offset);
        prefetch_into_l2((c < chunks ? m : v) + offset / 4u, size);
    }
}

// Round q's m and v asked into L2, a chunk per thread, unless HELD_L2_PREFETCH asked
// already; whole 16 bytes, so the last row's end is never passed.
static __device__ __forceinline__ void prefetch_round(const float* m, const float* v, u32 q,
                                                      u32 end) {
    constexpr u32 chunks = HELD_ROUND * 4u / HELD_PREFETCH_CHUNK;  // of m, and of v
    static_assert(chunks * HELD_PREFETCH_CHUNK == HELD_ROUND * 4u, "whole chunks per round");
    const u32 asked = first_asked_bytes(end);
    const u32 offset = HELD_ROUND * 4u * q + (threadIdx.x % chunks) * HELD_PREFETCH_CHUNK;
    if (threadIdx.x < 2u * chunks && offset >= asked && offset < end * 4u) {
        const u32 size = ::min(HELD_PREFETCH_CHUNK, (end * 4u - offset) / 16u * 16u);
        if (size) prefetch_into_l2((threadIdx.x < chunks ? m : v) + offset / 4u, size);
    }
}

// A row of V % 4 != 0 starts wherever row * V puts it, skew = (row * V) % 4 elements past a
// 16-byte boundary. Its quads are taken from that boundary: position p (a multiple of 4)
// is the row's element p - skew, and the row's aligned base (its start less skew floats)
// plus p is 16-byte aligned. So every quad inside the row moves as one float4, and only a
// row's first and last quads, which hold elements of the rows beside it, move element by
// element: those elements are neither read (the last row ends the table) nor written (they
// are another block's). Where V % 4 == 0 (WHOLE) the skew is 0 and every quad is whole.
template <bool WHOLE>
static __device__ __forceinline__ bool in_row(u32 p, u32 c, u32 skew, u32 vocab) {
    return WHOLE || (p + c >= skew && p + c < vocab + skew);
}

template <bool WHOLE>
static __device__ __forceinline__ bool whole_quad(u32 p, u32 skew, u32 vocab) {
    return WHOLE || (p >= skew && p + 4u <= vocab + skew);
}

// The quad at position p of the row whose aligned base is `at`: a whole quad by `load`
// (load_quad, or a form with the cache hints of STREAM_CACHE_HINTS: load_quad_last,
// load_quad_again), a row's first and last quads element by element, without hints.
template <bool WHOLE, typename Load>
static __device__ __forceinline__ float4 row_quad_by(const float* at, u32 p, u32 skew,
                                                     u32 vocab, Load load) {
    if (whole_quad<WHOLE>(p, skew, vocab)) return load(at + p);
    float4 q{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (in_row<WHOLE>(p, c, skew, vocab)) part(q, c) = at[p + c];
    }
    return q;
}

template <bool WHOLE>
static __device__ __forceinline__ float4 row_quad(const float* at, u32 p, u32 skew,
                                                  u32 vocab) {
    return row_quad_by<WHOLE>(at, p, skew, vocab, [](const float* q) { return load_quad(q); });
}

// The same, the quad's last read in the launch (load_quad_last's hints).
template <bool WHOLE>
static __device__ __forceinline__ float4 row_quad_last(const float* at, u32 p, u32 skew,
                                                       u32 vocab) {
    return row_quad_by<WHOLE>(at, p, skew, vocab,
                              [](const float* q) { return load_quad_last(q); });
}

template <bool WHOLE>
static __device__ __forceinline__ void store_quad_of(float* at, u32 p, u32 skew, u32 vocab,
                                                     float4 q) {
    if (whole_quad<WHOLE>(p, skew, vocab)) {
        store_quad(at + p, q);
        return;
    }
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (in_row<WHOLE>(p, c, skew, vocab)) at[p + c] = part(q, c);
    }
}

template <bool WHOLE>
static __device__ __forceinline__ void copy_quad_of(float4* to, const float* at, u32 p,
                                                    u32 skew, u32 vocab) {
    if (whole_quad<WHOLE>(p, skew, vocab)) {
        copy_quad_in(to, at + p);
        return;
    }
    const u32 address = (u32)__cvta_generic_to_shared(to);
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (in_row<WHOLE>(p, c, skew, vocab)) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(address + 4u * c),
                         "l"(at + p + c) : "memory");
        }
    }
}

static __device__ __forceinline__ void copies_done() {
    asm volatile("cp.async.wait_all;" : : : "memory");
}

// A row's place in memory: its aligned base (an offset into every V x V tensor) and skew.
template <bool WHOLE>
struct RowPlace {
    u64 at;
    u32 skew;

    static __device__ RowPlace of(u32 index, u32 vocab) {
        const u64 start = (u64)index * vocab;
        const u32 skew = WHOLE ? 0u : (u32)(start % 4u);
        return RowPlace{start - skew, skew};
    }
};

template <bool WHOLE>
struct HeldRow {
    const FusedArgs& a;
    HeldShared& shared;
    float4* row;  // the held quads: position p < held at row[p / 4]
    const float* w;  // the row's aligned base in memory
    u32 skew;
    u32 held;  // positions held, a multiple of 4
    float4* kept;  // the current exponentials: position p < kept_count at kept[p / 4]
    u32 kept_count;

    // One past the row's last position.
    __device__ u32 end() const { return a.vocab + skew; }
    __device__ u32 rounds() const { return (end() + HELD_ROUND - 1u) / HELD_ROUND; }
    __device__ u32 quad(u32 r) const { return HELD_ROUND * r + 4u * threadIdx.x; }
    __device__ bool is_held(u32 p) const { return p < held; }
    __device__ bool inside(u32 p, u32 c) const { return in_row<WHOLE>(p, c, skew, a.vocab); }
    // The quad of a V x V tensor's row at this row's place.
    __device__ float4 quad_of(const float* tensor, u32 p) const {
        return row_quad<WHOLE>(tensor, p, skew, a.vocab);
    }
    // The same, its last read in the launch (row_quad_last).
    __device__ float4 last_quad_of(const float* tensor, u32 p) const {
        return row_quad_last<WHOLE>(tensor, p, skew, a.vocab);
    }
    __device__ void store(float* tensor, u32 p, float4 q) const {
        store_quad_of<WHOLE>(tensor, p, skew, a.vocab, q);
    }
    // w's current quad at p: held, or read from memory.
    __device__ float4 w_quad(u32 p) const { return is_held(p) ? row[p / 4u] : quad_of(w, p); }

    // Warp 0's tree over partials (written before a barrier), published behind one more.
    template <typename Op>
    __device__ float publish(Op op) {
        return published_tree(shared.partials, shared.result, op);
    }

    // Lane-order fold of the row's values: values(p) gives this thread's quad at p (called
    // once per quad touching the row, so it may store what it computes). With `keep`, the
    // quads below kept_count are staged in kept, where they stay (the exponentials). Tree
    // lane l folds the row's elements l + 256 n, at positions l + skew + 256 n.
    template <typename Values>
    __device__ float fold(Values values, bool keep = false) {
        float acc = 0.0f;
        const u32 rounds_ = rounds(), kept_until = keep ? kept_count : 0u;
        const float* kept_values = (const float*)kept;
        const u32 lead = (threadIdx.x + skew) % LANES;
        for (u32 r = 0; r < rounds_; ++r) {
            float4* stage = shared.staged[r % 2u];
            const u32 p = quad(r);
            if (p < end()) {
                const float4 f = values(p);
                if (p < kept_until) {
                    kept[p / 4u] = f;
                } else {
                    stage[threadIdx.x] = f;
                }
            }
            __syncthreads();  // also: the fold of round r - 2 is done with this buffer
            if (threadIdx.x < LANES) {
                const float* f = (const float*)stage;
                const u32 first = HELD_ROUND * r;
#pragma unroll
                for (u32 n = 0; n < HELD_FOLD; ++n) {
                    const u32 e = LANES * n + lead;
                    const u32 position = first + e;
                    if (position >= skew && position < end()) {
                        acc = add(acc, position < kept_until ? kept_values[position] : f[e]);
                    }
                }
            }
        }
        if (threadIdx.x < LANES) shared.partials[threadIdx.x] = acc;
        __syncthreads();
        return publish(SumOp());
    }

    // The row max. `first`: w is read from memory, and the held quads are kept on the way,
    // unless `prefetched`: the held quads were copied in while the last row was updated.
    __device__ float max(bool first, bool prefetched) {
        float best = f32(NEG_INF);
        const u32 rounds_ = rounds();
        if (prefetched) copies_done();
        for (u32 r0 = 0; r0 < rounds_; r0 += HELD_DEPTH) {
            float4 x[HELD_DEPTH];
#pragma unroll
            for (u32 d = 0; d < HELD_DEPTH; ++d) {
                const u32 p = quad(r0 + d);
                if (p < end()) {
                    // First: w from memory, a held quad's only read from there; the others
                    // are read again (hints as load_quad_last and load_quad_again; a row's
                    // first and last quads element by element, without hints).
                    x[d] = !first || (prefetched && is_held(p)) ? w_quad(p)
                           : row_quad_by<WHOLE>(w, p, skew, a.vocab, [&](const float* q) {
                                 return is_held(p) ? load_quad_last(q) : load_quad_again(q);
                             });
                }
            }
#pragma unroll
            for (u32 d = 0; d < HELD_DEPTH; ++d) {
                const u32 p = quad(r0 + d);
                if (p < end()) {
                    if (first && !prefetched && is_held(p)) row[p / 4u] = x[d];
#pragma unroll
                    for (u32 c = 0; c < 4u; ++c) {
                        if (inside(p, c)) best = select_max(best, part(x[d], c));
                    }
                }
            }
        }
        // Its barrier also puts the held quads in shared memory for every thread.
        return block_max(best);
    }

    // The block's max of each thread's `best` (never NaN): the keyed max, or the literal
    // lane-order tree when it is a zero (its sign is the lane order's). One barrier first.
    __device__ float block_max(float best) {
        const float m = keyed_block_max(best, shared.keys, HELD_WARPS);
        if (m != 0.0f) return m;  // uniform: every warp reduced the same keys
        return literal_max();
    }

    // The tree's max: tree lane l folds j = l + 256 n in order, then the tree.
    __device__ float literal_max() {
        if (threadIdx.x < LANES) {
            float lane_max = f32(NEG_INF);
            for (u32 p = threadIdx.x + skew; p < end(); p += LANES) {
                lane_max = select_max(lane_max, is_held(p) ? ((const float*)row)[p] : w[p]);
            }
            shared.partials[threadIdx.x] = lane_max;
        }
        __syncthreads();
        return publish(MaxOp());
    }
};

static_assert(HELD_WARPS <= WARP, "a warp's lanes read the keys of every warp");

// The row a block takes next, whose held quads are copied in as the launch is done with
// this row's (w == nullptr: none).
template <bool WHOLE>
struct NextRow {
    const float* w;  // its aligned base
    u32 skew;

    __device__ void copy_in(const HeldRow<WHOLE>& row, u32 p, u32 vocab) const {
        copy_quad_of<WHOLE>(row.row + p / 4u, w, p, skew, vocab);
    }

    // The held positions the next row has past this row's end (at most one quad, where its
    // skew is larger): this row's passes never reach them, so they are copied here, each by
    // the thread whose position it is (the thread that reads it first).
    __device__ void copy_rest(const HeldRow<WHOLE>& row, u32 vocab) const {
        if (WHOLE || w == nullptr) return;
        for (u32 r = row.end() / HELD_ROUND; r * HELD_ROUND < vocab + skew; ++r) {
            const u32 p = row.quad(r);
            if (p >= row.end() && p < vocab + skew && row.is_held(p)) copy_in(row, p, vocab);
        }
    }
};

// One update on the thread's quad at p (w, m, v and corpus weights t given); w's new quad
// goes to the held row and, at the launch's last update or past the held part, to memory.
template <bool CORPUS, bool WHOLE>
static __device__ __forceinline__ void held_update_quad(
        const FusedArgs& a, HeldRow<WHOLE>& row, u64 at, u32 p, float row_max, float s,
        const AdamStep& step, u32 target, float weight_sum, bool last,
        NextRow<WHOLE> next, float4 wq, float4 mq, float4 vq, float4 tq, float& best) {
    const float4 eq = p < row.kept_count ? row.kept[p / 4u] : exponentials_of(wq, row_max,
                                                                              a.log2e);
#if HELD_FAST_DIVIDE
    float e[4], t[4], w[4], m[4], v[4];
    u32 js[4];
    const bool inside[4] = {row.inside(p, 0u), row.inside(p, 1u), row.inside(p, 2u),
                            row.inside(p, 3u)};
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        e[c] = part(eq, c);
        w[c] = part(wq, c);
        m[c] = part(mq, c);
        v[c] = part(vq, c);
        t[c] = part(tq, c);
        js[c] = p + c - row.skew;
    }
    adamw_together<CORPUS, 4>(a, step, e, s, js, inside, target, weight_sum, t, w, m, v);
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        part(wq, c) = w[c];
        part(mq, c) = m[c];
        part(vq, c) = v[c];
    }
#else
    const bool inside[4] = {row.inside(p, 0u), row.inside(p, 1u), row.inside(p, 2u),
                            row.inside(p, 3u)};
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (!inside[c]) continue;
        const u32 j = p + c - row.skew;
        const float prob = dvd(part(eq, c), s);
        const float g = gradient<CORPUS>(a, prob, j, target, weight_sum, part(tq, c));
        adamw_element(step, g, part(wq, c), part(mq, c), part(vq, c));
    }
#endif
    wq = canonical_quad(wq);
    if (HELD_RUNNING_MAX) {
#pragma unroll
        for (u32 c = 0; c < 4u; ++c) {
            if (inside[c]) best = select_max(best, part(wq, c));
        }
    }
    if (row.is_held(p)) {
        if (next.w != nullptr) {  // the launch is done with this row: its slot takes the next's
            next.copy_in(row, p, a.vocab);
        } else {
            row.row[p / 4u] = wq;
        }
    }
    if (last || !row.is_held(p)) row.store(a.parameters + at, p, wq);
    row.store(a.first_moment + at, p, canonical_quad(mq));
    row.store(a.second_moment + at, p, canonical_quad(vq));
}

// The update pass: HELD_UPDATE_DEPTH rounds of m, v (and weights) loads issued together.
template <bool CORPUS, bool WHOLE>
static __device__ void held_update(const FusedArgs& a, HeldRow<WHOLE>& row, u64 at,
                                   float row_max, float s, const AdamStep& step,
                                   u32 target, float weight_sum, bool last,
                                   NextRow<WHOLE> next, float& best) {
    const float* m = a.first_moment + at;
    const float* v = a.second_moment + at;
    const float* t = CORPUS ? a.weights + at : nullptr;
    const u32 rounds = row.rounds();
    for (u32 r0 = 0; r0 < rounds; r0 += HELD_UPDATE_DEPTH) {
        float4 mq[HELD_UPDATE_DEPTH], vq[HELD_UPDATE_DEPTH], tq[HELD_UPDATE_DEPTH];
        if (HELD_L2_AHEAD > 0u) {
#pragma unroll
            for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
                prefetch_round(m, v, r0 + d + HELD_L2_AHEAD, row.end());
            }
        }
#pragma unroll
        for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
            const u32 p = row.quad(r0 + d);
            if (p < row.end()) {
                mq[d] = row.last_quad_of(m, p);
                vq[d] = row.last_quad_of(v, p);
                tq[d] = CORPUS ? row.last_quad_of(t, p) : float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
        }
#pragma unroll
        for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
            const u32 p = row.quad(r0 + d);
            if (p < row.end()) {
                held_update_quad<CORPUS, WHOLE>(a, row, at, p, row_max, s, step, target,
                                                weight_sum, last, next, row.w_quad(p), mq[d],
                                                vq[d], tq[d], best);
            }
        }
    }
}

// One row's updates and finish. `prefetched`: its held quads are on their way in already;
// `next`: the row this block takes next.
template <bool CORPUS, bool WHOLE>
static __device__ void held_row_updates(const FusedArgs& a, HeldRow<WHOLE>& row,
                                        StagedScalars& scalars, u32 index, u64 at,
                                        bool prefetched, NextRow<WHOLE> next) {
    const float* t = CORPUS ? a.weights + at : nullptr;
    const float weight_sum =
        CORPUS ? row.fold([&](u32 p) { return row.quad_of(t, p); }) : 0.0f;
    const u32 target = CORPUS ? 0u : a.targets[index];
    const u32 passes = a.updates + (a.finish ? 1u : 0u);
    const NextRow<WHOLE> none{nullptr, 0u};
    float running_max = 0.0f;  // the max of the w the last update wrote (HELD_RUNNING_MAX)
    for (u32 k = 0; k < passes; ++k) {
        if (HELD_L2_PREFETCH > 0u && k < a.updates && (k == 0u || HELD_L2_PREFETCH_EACH)) {
            prefetch_moments(a.first_moment + at, a.second_moment + at, row.end());
        }
        if (k < a.updates) scalars.stage(a, k);
        const float row_max =
            HELD_RUNNING_MAX && k > 0u ? running_max : row.max(k == 0, prefetched);
        const float s = row.fold([&](u32 p) {
            return exponentials_of(row.w_quad(p), row_max, a.log2e);
        }, true);
        if (k == a.updates) {  // the finish: gradients and loss of the final w
            const float big_l = bob_log2(s);
            const float total = row.fold([&](u32 p) {
                const float4 wq = row.w_quad(p);
                const float4 tq = CORPUS ? row.last_quad_of(t, p)
                                         : float4{0.0f, 0.0f, 0.0f, 0.0f};
                const float4 eq = p < row.kept_count ? row.kept[p / 4u]
                                                     : exponentials_of(wq, row_max, a.log2e);
                float4 gq, terms{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    const u32 j = p + c - row.skew;
                    const float prob = dvd(part(eq, c), s);
                    part(gq, c) = canonical(gradient<CORPUS>(a, prob, j, target, weight_sum,
                                                             part(tq, c)));
                    const float z = exponent(part(wq, c), row_max, a.log2e);
                    if (CORPUS) {
                        part(terms, c) = mul(sub(big_l, z), part(tq, c));
                    } else if (row.inside(p, c) && j == target) {
                        a.loss[index] = canonical(mul(a.ln2, sub(big_l, z)));
                    }
                }
                row.store(a.gradients + at, p, gq);
                // Done with the held quad (the arithmetic above waited for its load): the slot
                // takes the next row's.
                if (next.w != nullptr && row.is_held(p)) next.copy_in(row, p, a.vocab);
                return terms;
            });
            if (threadIdx.x == 0) {
                if (CORPUS) {
                    a.loss[index] = canonical(mul(a.ln2, total));
                } else if (target >= a.vocab) {
                    a.loss[index] = f32(CANONICAL_NAN);
                }
            }
            break;
        }
        const AdamStep step = scalars.step(a, k);  // after the folds' barriers
        // Each thread reads back only the held quads it stored until the next max's barrier.
        const bool last = k + 1u == a.updates;
        float best = f32(NEG_INF);
        held_update<CORPUS, WHOLE>(a, row, at, row_max, s, step, target, weight_sum,
                                   last, last && !a.finish ? next : none, best);
        if (HELD_RUNNING_MAX && k + 1u < passes) {  // the next pass's max, behind one barrier
            running_max = row.block_max(best);
        }
    }
    if (passes > 0u) next.copy_rest(row, a.vocab);
}

// Rows blockIdx.x, + gridDim.x, ...: a grid of one block per SM keeps every SM's next row
// coming in while it updates the last.
template <bool CORPUS, bool WHOLE>
static __device__ void fused_train_held(const FusedArgs& a, HeldShared& shared,
                                        float4* held_row) {
    // The dynamic shared memory holds w first, then as many exponentials as fit.
    const u32 capacity = dynamic_shared_bytes() / 16u * 4u;
    // As much of the row as fits is held, in whole quads: the positions of any skew; at most
    // HELD_W_LIMIT.
    const u32 reach = WHOLE ? a.vocab : a.vocab + 3u;
    const u32 held = ::min(::min(capacity, (reach + 3u) / 4u * 4u), HELD_W_LIMIT / 4u * 4u);
    float4* const kept = held_row + held / 4u;
    const u32 room = HELD_KEEP_EXPONENTIALS ? capacity - held : 0u;
    StagedScalars scalars{shared.scalars, HELD_THREADS};
    bool prefetched = false;
    for (u32 index = blockIdx.x; index < a.vocab; index += gridDim.x) {
        if (index != blockIdx.x) __syncthreads();  // the last row's reads of shared memory
        const RowPlace<WHOLE> place = RowPlace<WHOLE>::of(index, a.vocab);
        const u32 next_index = index + gridDim.x;
        NextRow<WHOLE> next{nullptr, 0u};
        if (next_index < a.vocab) {
            const RowPlace<WHOLE> after = RowPlace<WHOLE>::of(next_index, a.vocab);
            next = NextRow<WHOLE>{a.parameters + after.at, after.skew};
        }
        const u32 end = a.vocab + place.skew;
        HeldRow<WHOLE> row{a, shared, held_row, a.parameters + place.at, place.skew, held,
                           kept, room < end ? room : end};
        held_row_updates<CORPUS, WHOLE>(a, row, scalars, index, place.at, prefetched, next);
        prefetched = next.w != nullptr && a.updates + (a.finish ? 1u : 0u) > 0u;
    }
}

// The kernels' body: rows 16-byte aligned where V % 4 == 0, each with its skew else.
template <bool CORPUS>
static __device__ void held_kernel(const FusedArgs& a) {
    __shared__ HeldShared shared;
    extern __shared__ float4 held_row[];
    if (blockDim.x != HELD_THREADS) __trap();
    if (a.vocab % 4u == 0u) {
        fused_train_held<CORPUS, true>(a, shared, held_row);
    } else {
        fused_train_held<CORPUS, false>(a, shared, held_row);
    }
}

extern "C" __global__ HELD_BOUNDS void bob_fused_train_held_hard(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    held_kernel<false>(a);
}

extern "C" __global__ HELD_BOUNDS void bob_fused_train_held_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    held_kernel<true>(a);
}
