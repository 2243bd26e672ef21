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
// is taken from the w the update before it wrote (each thread keeps the max of the w it
// writes, the next pass takes the block's max of those: the same keyed max, the same
// fallback to the lane-order tree for a zero), so only a launch's first update of a row
// has a pass of its own for the max. The max of a set of values is the same whoever folds
// it: only a zero's sign depends on the order, and a zero takes the tree.
//
// The grid is one block per SM (the plan target's multiprocessors); block b takes rows b,
// b + gridDim.x, ... While it writes a row's last update (or its finish), each thread
// copies the next row's held quads into the slots it has finished with (cp.async), so the
// next row's first pass finds w in shared memory. Any grid gives the same bits.
//
// Thread t takes the quad at j = 4 HELD_THREADS r + 4 t in round r: the max and the update
// are elementwise, so any mapping gives their bits. A lane-order fold (the row sum, the
// corpus weight sum and loss) is one chain per tree lane l over j = l + 256 n, so each
// round's values are staged in shared memory by element and the first 256 threads fold
// their HELD_FOLD of the round in order, two rounds' buffers alternating so one barrier a
// round suffices. The max is the integer max of order keys over the block, or the literal
// lane-order tree when it is a zero (its sign is the lane order's).
//
// The shape: HELD_THREADS threads a block (128 registers: one block per SM), HELD_DEPTH
// rounds of w loads in flight per thread while the row is first read and HELD_UPDATE_DEPTH
// rounds of m and v (and corpus weights) in the update; a quad's divisions and roots are
// issued together (adamw_together). As the block begins each update of a row it asks the
// L2 cache for the first eighth of the row's m and v (cp.async.bulk.prefetch, sm_90), and
// the update asks for the m and v of the round HELD_L2_AHEAD rounds ahead of the one it
// reads, so memory works during the max and the sum and the update finds them in L2. The
// plan launches the block the image's launch bounds name (signatures.BLOCK_FROM_IMAGE).
#define HELD_THREADS 512u
#define HELD_ROUND (4u * HELD_THREADS)  // elements per round: one quad per thread
#define HELD_WARPS (HELD_THREADS / WARP)
#define HELD_FOLD (HELD_ROUND / LANES)  // a tree lane's elements in one round
#define HELD_DEPTH 4u
#define HELD_UPDATE_DEPTH 2u
#define HELD_L2_AHEAD 2u
#define HELD_PREFETCH_CHUNK 4096u  // bytes one thread asks into L2 at a time
#define HELD_BOUNDS __launch_bounds__(HELD_THREADS, 1)

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

// The same from any 4-byte aligned address (a row of V % 4 != 0): from the 16-byte boundary
// below it, the bytes asked for rounded down to whole 16 (a request is a hint: the few bytes
// before the row are the table's, the last row's end is never passed).
static __device__ __forceinline__ void prefetch_row_into_l2(const float* from, u32 bytes) {
    const u64 address = (u64)from;
    const u32 skew = (u32)(address % 16u);
    const u32 whole = (bytes + skew) / 16u * 16u;
    if (whole) prefetch_into_l2((const float*)(address - skew), whole);
}

// The bytes of a row's m (and of its v) asked into L2 as an update of the row begins:
// the first eighth, a multiple of 16.
static __device__ __forceinline__ u32 first_asked_bytes(u32 vocab) {
    return vocab * 4u / 8u / 16u * 16u;
}

// This row's m and v, their first eighths, asked into L2 in chunks, one chunk per thread.
template <bool WHOLE>
static __device__ __forceinline__ void prefetch_moments(const float* m, const float* v,
                                                        u32 vocab) {
    const u32 bytes = first_asked_bytes(vocab);
    const u32 chunks = (bytes + HELD_PREFETCH_CHUNK - 1u) / HELD_PREFETCH_CHUNK;
    for (u32 c = threadIdx.x; c < 2u * chunks; c += HELD_THREADS) {
        const u32 offset = (c % chunks) * HELD_PREFETCH_CHUNK;
        const u32 size = ::min(HELD_PREFETCH_CHUNK, bytes - offset);
        if (WHOLE) {
            prefetch_into_l2((c < chunks ? m : v) + offset / 4u, size);
        } else {
            prefetch_row_into_l2((c < chunks ? m : v) + offset / 4u, size);
        }
    }
}

// Round q's m and v asked into L2, a chunk per thread, unless prefetch_moments asked
// already.
template <bool WHOLE>
static __device__ __forceinline__ void prefetch_round(const float* m, const float* v, u32 q,
                                                      u32 vocab) {
    constexpr u32 chunks = HELD_ROUND * 4u / HELD_PREFETCH_CHUNK;  // of m, and of v
    static_assert(chunks * HELD_PREFETCH_CHUNK == HELD_ROUND * 4u, "whole chunks per round");
    const u32 asked = first_asked_bytes(vocab);
    const u32 offset = HELD_ROUND * 4u * q + (threadIdx.x % chunks) * HELD_PREFETCH_CHUNK;
    if (threadIdx.x < 2u * chunks && offset >= asked && offset < vocab * 4u) {
        const u32 size = ::min(HELD_PREFETCH_CHUNK, vocab * 4u - offset);
        if (WHOLE) {
            prefetch_into_l2((threadIdx.x < chunks ? m : v) + offset / 4u, size);
        } else {
            prefetch_row_into_l2((threadIdx.x < chunks ? m : v) + offset / 4u, size);
        }
    }
}

// A row's four elements from j (those below V) when V % 4 != 0: the row starts wherever
// row * V puts it, so the quad is read, written and copied element by element, and the
// elements past the row's end are neither read (the last row ends the table) nor written
// (they are the next row's, another block's).
static __device__ __forceinline__ float4 load_row_quad(const float* p, u32 j, u32 vocab) {
    float4 q{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (j + c < vocab) part(q, c) = p[j + c];
    }
    return q;
}

static __device__ __forceinline__ void store_row_quad(float* p, u32 j, u32 vocab, float4 q) {
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (j + c < vocab) p[j + c] = part(q, c);
    }
}

static __device__ __forceinline__ void copy_row_quad_in(float4* to, const float* from, u32 j,
                                                        u32 vocab) {
    const u32 address = (u32)__cvta_generic_to_shared(to);
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (j + c < vocab) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(address + 4u * c),
                         "l"(from + j + c) : "memory");
        }
    }
}

// Row quads: whole float4s where V % 4 == 0 (WHOLE: every row 16-byte aligned), else the
// element by element forms above.
template <bool WHOLE>
static __device__ __forceinline__ float4 row_quad(const float* p, u32 j, u32 vocab) {
    return WHOLE ? load_quad(p + j) : load_row_quad(p, j, vocab);
}

template <bool WHOLE>
static __device__ __forceinline__ void store_quad_of(float* p, u32 j, u32 vocab, float4 q) {
    if (WHOLE) {
        store_quad(p + j, q);
    } else {
        store_row_quad(p, j, vocab, q);
    }
}

template <bool WHOLE>
static __device__ __forceinline__ void copy_quad_of(float4* to, const float* from, u32 j,
                                                    u32 vocab) {
    if (WHOLE) {
        copy_quad_in(to, from + j);
    } else {
        copy_row_quad_in(to, from, j, vocab);
    }
}

// The element c of the quad at j is in the row (always, where V % 4 == 0).
template <bool WHOLE>
static __device__ __forceinline__ bool in_row(u32 j, u32 c, u32 vocab) {
    return WHOLE || j + c < vocab;
}

static __device__ __forceinline__ void copies_done() {
    asm volatile("cp.async.wait_all;" : : : "memory");
}

template <bool WHOLE>
struct HeldRow {
    const FusedArgs& a;
    HeldShared& shared;
    float4* row;  // the held quads: element j < held at row[j / 4]
    const float* w;  // the row in memory
    u32 held;  // elements held, a multiple of 4 (past V where a partial last quad is held)
    float4* kept;  // the current exponentials: element j < kept_count at kept[j / 4]
    u32 kept_count;  // a multiple of 4

    __device__ u32 rounds() const { return (a.vocab + HELD_ROUND - 1u) / HELD_ROUND; }
    __device__ u32 quad(u32 r) const { return HELD_ROUND * r + 4u * threadIdx.x; }
    __device__ bool is_held(u32 j) const { return j < held; }
    // w's current quad at j: held, or read from memory.
    __device__ float4 w_quad(u32 j) const {
        return is_held(j) ? row[j / 4u] : row_quad<WHOLE>(w, j, a.vocab);
    }

    // Warp 0's tree over partials (written before a barrier), published behind one more.
    template <typename Op>
    __device__ float publish(Op op) {
        return published_tree(shared.partials, shared.result, op);
    }

    // Lane-order fold of the row's values: values(j) gives this thread's quad at j (called
    // once per quad inside the row, so it may store what it computes). With `keep`, the
    // quads below kept_count are staged in kept, where they stay (the exponentials).
    template <typename Values>
    __device__ float fold(Values values, bool keep = false) {
        float acc = 0.0f;
        const u32 rounds_ = rounds(), kept_until = keep ? kept_count : 0u;
        const float* kept_values = (const float*)kept;
        for (u32 r = 0; r < rounds_; ++r) {
            float4* stage = shared.staged[r % 2u];
            const u32 j = quad(r);
            if (j < a.vocab) {
                const float4 f = values(j);
                if (j < kept_until) {
                    kept[j / 4u] = f;
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
                    const u32 e = LANES * n + threadIdx.x;
                    if (first + e < a.vocab) {
                        acc = add(acc, first + e < kept_until ? kept_values[first + e] : f[e]);
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
                const u32 j = quad(r0 + d);
                if (j < a.vocab) {
                    // First: w from memory (a held quad's only read from there).
                    x[d] = !first || (prefetched && is_held(j)) ? w_quad(j)
                                                                : row_quad<WHOLE>(w, j, a.vocab);
                }
            }
#pragma unroll
            for (u32 d = 0; d < HELD_DEPTH; ++d) {
                const u32 j = quad(r0 + d);
                if (j < a.vocab) {
                    if (first && !prefetched && is_held(j)) row[j / 4u] = x[d];
#pragma unroll
                    for (u32 c = 0; c < 4u; ++c) {
                        if (in_row<WHOLE>(j, c, a.vocab)) best = select_max(best, part(x[d], c));
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
            for (u32 j = threadIdx.x; j < a.vocab; j += LANES) {
                lane_max = select_max(lane_max, is_held(j) ? ((const float*)row)[j] : w[j]);
            }
            shared.partials[threadIdx.x] = lane_max;
        }
        __syncthreads();
        return publish(MaxOp());
    }
};

static_assert(HELD_WARPS <= WARP, "a warp's lanes read the keys of every warp");

// One update on the thread's quad at j (w, m, v and corpus weights t given); w's new quad
// goes to the held row and, at the launch's last update or past the held part, to memory.
template <bool CORPUS, bool WHOLE>
static __device__ __forceinline__ void held_update_quad(
        const FusedArgs& a, HeldRow<WHOLE>& row, u64 base, u32 j, float row_max, float s,
        const AdamStep& step, u32 target, float weight_sum, bool last, const float* next_w,
        float4 wq, float4 mq, float4 vq, float4 tq, float& best) {
    const float4 eq = j < row.kept_count ? row.kept[j / 4u] : exponentials_of(wq, row_max,
                                                                              a.log2e);
    float e[4], t[4], w[4], m[4], v[4];
    u32 js[4];
    const bool inside[4] = {in_row<WHOLE>(j, 0u, a.vocab), in_row<WHOLE>(j, 1u, a.vocab),
                            in_row<WHOLE>(j, 2u, a.vocab), in_row<WHOLE>(j, 3u, a.vocab)};
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        e[c] = part(eq, c);
        w[c] = part(wq, c);
        m[c] = part(mq, c);
        v[c] = part(vq, c);
        t[c] = part(tq, c);
        js[c] = j + c;
    }
    adamw_together<CORPUS, 4>(a, step, e, s, js, inside, target, weight_sum, t, w, m, v);
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        part(wq, c) = w[c];
        part(mq, c) = m[c];
        part(vq, c) = v[c];
    }
    wq = canonical_quad(wq);
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        if (inside[c]) best = select_max(best, part(wq, c));
    }
    if (row.is_held(j)) {
        if (next_w != nullptr) {  // the launch is done with this row: its slot takes the next's
            copy_quad_of<WHOLE>(row.row + j / 4u, next_w, j, a.vocab);
        } else {
            row.row[j / 4u] = wq;
        }
    }
    if (last || !row.is_held(j)) store_quad_of<WHOLE>(a.parameters + base, j, a.vocab, wq);
    store_quad_of<WHOLE>(a.first_moment + base, j, a.vocab, canonical_quad(mq));
    store_quad_of<WHOLE>(a.second_moment + base, j, a.vocab, canonical_quad(vq));
}

// The update pass: HELD_UPDATE_DEPTH rounds of m, v (and weights) loads issued together.
template <bool CORPUS, bool WHOLE>
static __device__ void held_update(const FusedArgs& a, HeldRow<WHOLE>& row, u64 base,
                                   float row_max,
                                   float s, const AdamStep& step, u32 target,
                                   float weight_sum, bool last, const float* next_w,
                                   float& best) {
    const float* m = a.first_moment + base;
    const float* v = a.second_moment + base;
    const float* t = CORPUS ? a.weights + base : nullptr;
    const u32 rounds = row.rounds();
    for (u32 r0 = 0; r0 < rounds; r0 += HELD_UPDATE_DEPTH) {
        float4 mq[HELD_UPDATE_DEPTH], vq[HELD_UPDATE_DEPTH], tq[HELD_UPDATE_DEPTH];
#pragma unroll
        for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
            prefetch_round<WHOLE>(m, v, r0 + d + HELD_L2_AHEAD, a.vocab);
        }
#pragma unroll
        for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
            const u32 j = row.quad(r0 + d);
            if (j < a.vocab) {
                mq[d] = row_quad<WHOLE>(m, j, a.vocab);
                vq[d] = row_quad<WHOLE>(v, j, a.vocab);
                tq[d] = CORPUS ? row_quad<WHOLE>(t, j, a.vocab) : float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
        }
#pragma unroll
        for (u32 d = 0; d < HELD_UPDATE_DEPTH; ++d) {
            const u32 j = row.quad(r0 + d);
            if (j < a.vocab) {
                held_update_quad<CORPUS, WHOLE>(a, row, base, j, row_max, s, step, target,
                                                weight_sum,
                                         last, next_w, row.w_quad(j), mq[d], vq[d], tq[d],
                                         best);
            }
        }
    }
}

// One row's updates and finish. `prefetched`: its held quads are on their way in already;
// `next_w`: the row this block takes next, whose held quads are copied in as the launch is
// done with this row's (nullptr: none).
template <bool CORPUS, bool WHOLE>
static __device__ void held_row_updates(const FusedArgs& a, HeldRow<WHOLE>& row,
                                        StagedScalars& scalars, u32 index, bool prefetched,
                                        const float* next_w) {
    const u64 base = (u64)index * a.vocab;
    const float* t = CORPUS ? a.weights + base : nullptr;
    const float weight_sum =
        CORPUS ? row.fold([&](u32 j) { return row_quad<WHOLE>(t, j, a.vocab); }) : 0.0f;
    const u32 target = CORPUS ? 0u : a.targets[index];
    const u32 passes = a.updates + (a.finish ? 1u : 0u);
    float running_max = 0.0f;  // the max of the w the last update wrote
    for (u32 k = 0; k < passes; ++k) {
        if (k < a.updates) {
            prefetch_moments<WHOLE>(a.first_moment + base, a.second_moment + base, a.vocab);
        }
        if (k < a.updates) scalars.stage(a, k);
        const float row_max = k > 0u ? running_max : row.max(k == 0, prefetched);
        const float s = row.fold([&](u32 j) {
            return exponentials_of(row.w_quad(j), row_max, a.log2e);
        }, true);
        if (k == a.updates) {  // the finish: gradients and loss of the final w
            const float big_l = bob_log2(s);
            const float total = row.fold([&](u32 j) {
                const float4 wq = row.w_quad(j);
                const float4 tq = CORPUS ? row_quad<WHOLE>(t, j, a.vocab)
                                         : float4{0.0f, 0.0f, 0.0f, 0.0f};
                const float4 eq = j < row.kept_count ? row.kept[j / 4u]
                                                     : exponentials_of(wq, row_max, a.log2e);
                float4 gq, terms{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    const float p = dvd(part(eq, c), s);
                    part(gq, c) = canonical(gradient<CORPUS>(a, p, j + c, target, weight_sum,
                                                             part(tq, c)));
                    const float z = exponent(part(wq, c), row_max, a.log2e);
                    if (CORPUS) {
                        part(terms, c) = mul(sub(big_l, z), part(tq, c));
                    } else if (j + c == target) {
                        a.loss[index] = canonical(mul(a.ln2, sub(big_l, z)));
                    }
                }
                store_quad_of<WHOLE>(a.gradients + base, j, a.vocab, gq);
                // Done with the held quad (the arithmetic above waited for its load): the slot
                // takes the next row's.
                if (next_w != nullptr && row.is_held(j)) {
                    copy_quad_of<WHOLE>(row.row + j / 4u, next_w, j, a.vocab);
                }
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
        held_update<CORPUS, WHOLE>(a, row, base, row_max, s, step, target, weight_sum, last,
                            last && !a.finish ? next_w : nullptr, best);
        if (k + 1u < passes) {  // the next pass's max, behind one barrier
            running_max = row.block_max(best);
        }
    }
}

// Rows blockIdx.x, + gridDim.x, ...: a grid of one block per SM keeps every SM's next row
// coming in while it updates the last.
template <bool CORPUS, bool WHOLE>
static __device__ void fused_train_held(const FusedArgs& a, HeldShared& shared,
                                        float4* held_row) {
    // The dynamic shared memory holds w first, then as many exponentials as fit.
    const u32 capacity = dynamic_shared_bytes() / 16u * 4u;
    // As much of the row as fits is held, in whole quads (a partial last quad's slot too).
    // The outer min, with the largest multiple of 4 a u32 holds, never binds; it keeps the
    // compiled code that of dev/cuda's knob source.
    const u32 held = ::min(::min(capacity, (a.vocab + 3u) / 4u * 4u), 0xFFFFFFFCu);
    float4* const kept = held_row + held / 4u;
    const u32 room = capacity - held;
    StagedScalars scalars{shared.scalars, HELD_THREADS};
    bool prefetched = false;
    for (u32 index = blockIdx.x; index < a.vocab; index += gridDim.x) {
        if (index != blockIdx.x) __syncthreads();  // the last row's reads of shared memory
        const u32 next = index + gridDim.x;
        const float* next_w = next < a.vocab ? a.parameters + (u64)next * a.vocab : nullptr;
        HeldRow<WHOLE> row{a, shared, held_row, a.parameters + (u64)index * a.vocab, held,
                           kept, room < a.vocab ? room : a.vocab};
        held_row_updates<CORPUS, WHOLE>(a, row, scalars, index, prefetched, next_w);
        prefetched = next_w != nullptr && a.updates + (a.finish ? 1u : 0u) > 0u;
    }
}

// The kernels' body: rows whole float4s apart where V % 4 == 0, element by element else.
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
