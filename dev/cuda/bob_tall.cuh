// -- tall: a block of TALL_THREADS threads per row, the row on chip (V <= 8192) ----------
//
// Thread (q, l) = (threadIdx.x / 256, threadIdx.x % 256) holds elements
// j = l + 256 (TALL_SLOTS q + i), i < TALL_SLOTS: part q of tree lane l's elements, in
// order (quarters at 1024 threads, halves at 512). A lane's max folds split at parts give
// the same value (the select keeps the first of equal values; no partial is NaN), so each
// thread folds its part and the lane's parts are combined in order before the tree. A
// lane's sum is one ordered chain, so the exponentials go to shared memory and the first
// 256 threads fold their lane's 32 in order. The tree over the 256 lane partials is run
// by warp 0, which publishes the result (TALL_EVERY_WARP_TREE 0), or by every warp after
// the same barrier (1): the same operations in the same order, one barrier fewer.
//
// bob_kernels.cu includes this file once per mode, in a namespace of its own, with
// TALL_MODE_CORPUS, TALL_THREADS and TALL_UNGUARDED defined for that mode (from
// TALL_<MODE>_THREADS and TALL_<MODE>_UNGUARDED); it defines that mode's entry point.
// The tuning macros change speed, never bits (dev/cuda/bench_tall.py --variants):
// - TALL_THREADS: 1024 (8 elements per thread, 64 registers) or 512 (16 elements per
//   thread, 128 registers). The plan launches the block the image's launch bounds name
//   (signatures.BLOCK_FROM_IMAGE), so a variant plans to match.
// - TALL_HOLD_WEIGHTS: corpus weights held in registers (1) or read from L1 per update (0).
// - TALL_CORPUS_FULL: the corpus kernel also takes the full-row path without per-element
//   bounds tests at V = 8192 (1). At 1024 threads both corpus paths spilled (8 bytes).
// - TALL_REGISTER_CHAIN: the exponentials stay in registers and each lane's sum chain runs
//   through its parts in turn, part q handing its running sum to part q + 1 through shared
//   memory behind a barrier (TALL_PARTS barriers: meant for 512 threads, two parts), rather
//   than through shared memory element by element (0).
// - TALL_UNGUARDED: on rows shorter than TALL_VOCAB every slot runs the arithmetic (max,
//   exponentials, AdamW) as straight-line code, a slot past V holding w = -inf (its e_j is
//   0, it never wins the max, it stays -inf, and no fold reads it); only memory accesses and
//   the sums' chains test the bounds (1). Or each slot's arithmetic sits behind its bounds
//   test, a branch around code with division subroutines (0).
#define TALL_VOCAB 8192u
#define TALL_SLOTS (TALL_VOCAB / TALL_THREADS)  // elements per thread
#define TALL_PARTS (TALL_THREADS / LANES)  // threads per tree lane
#define TALL_WARPS (TALL_THREADS / WARP)
#define LANE_ELEMENTS (TALL_VOCAB / LANES)  // a tree lane's elements at most
#ifndef TALL_HOLD_WEIGHTS
#define TALL_HOLD_WEIGHTS (TALL_THREADS <= 512u)
#define TALL_HOLD_WEIGHTS_HERE  // defined by this inclusion: undefined at its end
#endif
#ifndef TALL_CORPUS_FULL
#define TALL_CORPUS_FULL (TALL_THREADS <= 512u)
#define TALL_CORPUS_FULL_HERE  // defined by this inclusion: undefined at its end
#endif
#ifndef TALL_EVERY_WARP_TREE
#define TALL_EVERY_WARP_TREE 0
#define TALL_EVERY_WARP_TREE_HERE  // defined by this inclusion: undefined at its end
#endif
#ifndef TALL_REGISTER_CHAIN
#define TALL_REGISTER_CHAIN (TALL_THREADS <= 512u)
#define TALL_REGISTER_CHAIN_HERE  // defined by this inclusion: undefined at its end
#endif
#ifndef TALL_FAST_DIVIDE  // AdamW as adamw_together (the fast division and root) in chunks
#define TALL_FAST_DIVIDE 0
#define TALL_FAST_DIVIDE_HERE  // defined by this inclusion: undefined at its end
#endif
#ifndef TALL_FAST_CHUNK  // a thread's slots per adamw_together: registers against issue
#define TALL_FAST_CHUNK 4u
#define TALL_FAST_CHUNK_HERE  // defined by this inclusion: undefined at its end
#endif
#define TALL_BOUNDS __launch_bounds__(TALL_THREADS, 1)

struct __align__(16) TallShared {
    float kept[TALL_VOCAB];  // by element: exponentials or loss terms for the lanes' folds
    float part_max[TALL_PARTS * LANES];  // tree lane l's part maxima at TALL_PARTS l + q
    float partials[LANES];
    float scalars[2 * TALL_THREADS];  // StagedScalars: TALL_THREADS / 4 updates per chunk
    int keys[TALL_WARPS];  // each warp's max key
    float result;
#if TALL_REGISTER_CHAIN
    float handoff[LANES];  // a lane's running sum, from one part to the next
#endif
};

// How many of thread (part, lane)'s elements j = lane + 256 (TALL_SLOTS part + i) are < V.
static __device__ __forceinline__ u32 elements_inside(u32 vocab, u32 lane, u32 part) {
    const u32 first = lane + LANES * TALL_SLOTS * part;
    if (first >= vocab) return 0u;
    const u32 count = (vocab - first + LANES - 1u) / LANES;
    return count < TALL_SLOTS ? count : TALL_SLOTS;
}

template <bool FULL>  // V = TALL_VOCAB: every thread's elements inside the row
struct TallRow {
    const FusedArgs& a;
    TallShared& shared;
    u32 lane, part;
    u32 count;  // this thread's elements inside the row: the first `count` (elements_inside)

    __device__ u32 element(u32 i) const { return lane + LANES * (TALL_SLOTS * part + i); }
    __device__ bool inside(u32 i) const { return FULL || i < count; }
    // Does slot i run the arithmetic? Every slot when TALL_UNGUARDED (past V: w = -inf).
    __device__ bool computed(u32 i) const { return TALL_UNGUARDED || inside(i); }

    // The tree over `partials` (written before a barrier): warp 0 runs it and publishes it
    // behind one more barrier, or every warp runs it.
    template <typename Op>
    __device__ float publish(Op op) {
        if (TALL_EVERY_WARP_TREE) return warp_tree(shared.partials, op);
        return published_tree(shared.partials, shared.result, op);
    }

    // The row max: the integer max of order-preserving keys over the block (two warp
    // instructions and one barrier), or, when the maximum is a zero, the literal tree.
    __device__ float max(const float (&w)[TALL_SLOTS]) {
        float held = f32(NEG_INF);
#pragma unroll
        for (u32 i = 0; i < TALL_SLOTS; ++i) {
            if (computed(i)) held = select_max(held, w[i]);
        }
        const float m = keyed_block_max(held, shared.keys, TALL_WARPS);
        if (m != 0.0f) return m;  // uniform: every warp reduced the same keys
        return literal_max(held);
    }

    // The tree's max: a lane's part maxima in order, then the tree.
    __device__ float literal_max(float held) {
        shared.part_max[TALL_PARTS * lane + part] = held;
        __syncthreads();
        if (threadIdx.x < LANES) {
            const float* parts = shared.part_max + TALL_PARTS * threadIdx.x;
            float lane_max = parts[0];
#pragma unroll
            for (u32 q = 1; q < TALL_PARTS; ++q) lane_max = select_max(lane_max, parts[q]);
            shared.partials[threadIdx.x] = lane_max;
        }
        __syncthreads();
        return publish(MaxOp());
    }

    // The row max, e_j into kept, and the row sum of the current w.
    __device__ float exponentials(const float (&w)[TALL_SLOTS], float& row_max) {
        row_max = max(w);
#pragma unroll
        for (u32 i = 0; i < TALL_SLOTS; ++i) {
            if (computed(i)) {
                shared.kept[element(i)] = bob_exp2(exponent(w[i], row_max, a.log2e));
            }
        }
        return sum_kept();
    }

#if TALL_REGISTER_CHAIN
    // The row max, e_j into e, and the row sum: each lane's chain through its parts in turn.
    __device__ float chain_exponentials(const float (&w)[TALL_SLOTS], float (&e)[TALL_SLOTS],
                                        float& row_max) {
        row_max = max(w);
#pragma unroll
        for (u32 i = 0; i < TALL_SLOTS; ++i) {
            e[i] = computed(i) ? bob_exp2(exponent(w[i], row_max, a.log2e)) : 0.0f;
        }
#pragma unroll
        for (u32 q = 0; q < TALL_PARTS; ++q) {
            if (part == q) {
                float acc = q == 0 ? 0.0f : shared.handoff[lane];
#pragma unroll
                for (u32 i = 0; i < TALL_SLOTS; ++i) {
                    if (inside(i)) acc = add(acc, e[i]);
                }
                if (q + 1 < TALL_PARTS) {
                    shared.handoff[lane] = acc;
                } else {
                    shared.partials[lane] = acc;
                }
            }
            __syncthreads();
        }
        return publish(SumOp());
    }
#endif

    // The row sum of the values each thread put in kept[element(i)] (past V: nothing).
    __device__ float sum_kept() {
        __syncthreads();
        if (threadIdx.x < LANES) {
            float acc = 0.0f;
#pragma unroll
            for (u32 n = 0; n < LANE_ELEMENTS; ++n) {
                const u32 j = threadIdx.x + LANES * n;
                if (j < a.vocab) acc = add(acc, shared.kept[j]);
            }
            shared.partials[threadIdx.x] = acc;
        }
        __syncthreads();
        return publish(SumOp());
    }
};

// A thread's corpus weights: held in registers (TALL_HOLD_WEIGHTS) or read from the row
// in memory (L1) where used. 64 registers (1024 threads) hold w, m and v but not the
// weights too, and a kernel here may not spill (Bob's streams give no local memory).
template <bool HOLD>
struct TallWeights;

// A slot past V (TALL_UNGUARDED computes it) has weight 0 and reads no memory.
template <>
struct TallWeights<true> {
    float held[TALL_SLOTS];
    __device__ void load(const float* t, u32 i, u32 j, bool inside) {
        held[i] = inside ? t[j] : 0.0f;
    }
    __device__ float at(const float*, u32 i, u32, bool) const { return held[i]; }
};

template <>
struct TallWeights<false> {
    __device__ void load(const float*, u32, u32, bool) {}
    __device__ float at(const float* t, u32, u32 j, bool inside) const {
        return inside ? t[j] : 0.0f;
    }
};

// A thread's exponentials of the current row: in shared memory (kept, the lanes' folds
// read them there) or in registers (TALL_REGISTER_CHAIN).
template <bool HELD>
struct TallExponentials;

template <>
struct TallExponentials<false> {
    template <bool FULL>
    __device__ float row_sum(TallRow<FULL>& row, const float (&w)[TALL_SLOTS], float& row_max) {
        return row.exponentials(w, row_max);
    }
    __device__ float at(const TallShared& shared, u32, u32 j) const { return shared.kept[j]; }
};

#if TALL_REGISTER_CHAIN
template <>
struct TallExponentials<true> {
    float held[TALL_SLOTS];
    template <bool FULL>
    __device__ float row_sum(TallRow<FULL>& row, const float (&w)[TALL_SLOTS], float& row_max) {
        return row.chain_exponentials(w, held, row_max);
    }
    __device__ float at(const TallShared&, u32 i, u32) const { return held[i]; }
};
#endif

template <bool CORPUS, bool FULL>
static __device__ void fused_tall(const FusedArgs& a, TallShared& shared) {
    const u32 lane = threadIdx.x % LANES, part = threadIdx.x / LANES;
    TallRow<FULL> row{a, shared, lane, part, elements_inside(a.vocab, lane, part)};
    StagedScalars scalars{shared.scalars, TALL_THREADS};
    const u64 base = (u64)blockIdx.x * a.vocab;
    const float* t = CORPUS ? a.weights + base : nullptr;
    TallWeights<CORPUS && TALL_HOLD_WEIGHTS> weights;
    float w[TALL_SLOTS], m[TALL_SLOTS], v[TALL_SLOTS];
#pragma unroll
    for (u32 i = 0; i < TALL_SLOTS; ++i) {
        w[i] = TALL_UNGUARDED ? f32(NEG_INF) : 0.0f;  // past V: never the max, e_j = 0
        m[i] = v[i] = 0.0f;
        if (CORPUS) weights.load(t, i, row.element(i), row.inside(i));
        if (row.inside(i)) {
            const u32 j = row.element(i);
            w[i] = a.parameters[base + j];
            m[i] = a.first_moment[base + j];
            v[i] = a.second_moment[base + j];
            if (CORPUS) shared.kept[j] = weights.at(t, i, j, true);
        }
    }
    const float weight_sum = CORPUS ? row.sum_kept() : 0.0f;
    const u32 target = CORPUS ? 0u : a.targets[blockIdx.x];
    TallExponentials<TALL_REGISTER_CHAIN != 0> e;

    for (u32 k = 0; k < a.updates; ++k) {
        scalars.stage(a, k);
        float row_max;
        const float s = e.row_sum(row, w, row_max);
        const AdamStep step = scalars.step(a, k);  // after the trees' barriers
#if TALL_FAST_DIVIDE
        // A slot that runs no arithmetic (past V, guarded) goes through with e = 0 and
        // weight 0; its values are never stored, folded or maxed.
        constexpr u32 C = TALL_FAST_CHUNK;
        static_assert(TALL_SLOTS % C == 0, "whole chunks of a thread's slots");
#pragma unroll
        for (u32 first = 0; first < TALL_SLOTS; first += C) {
            float ec[C], tc[C], wc[C], mc[C], vc[C];
            u32 jc[C];
            bool ic[C];
#pragma unroll
            for (u32 i = 0; i < C; ++i) {
                const u32 slot = first + i;
                jc[i] = row.element(slot);
                ic[i] = row.inside(slot);
                ec[i] = row.computed(slot) ? e.at(shared, slot, jc[i]) : 0.0f;
                tc[i] = CORPUS ? weights.at(t, slot, jc[i], ic[i]) : 0.0f;
                wc[i] = w[slot];
                mc[i] = m[slot];
                vc[i] = v[slot];
            }
            adamw_together<CORPUS, C>(a, step, ec, s, jc, ic, target, weight_sum, tc, wc, mc,
                                      vc);
#pragma unroll
            for (u32 i = 0; i < C; ++i) {
                w[first + i] = wc[i];
                m[first + i] = mc[i];
                v[first + i] = vc[i];
            }
        }
#else
#pragma unroll
        for (u32 i = 0; i < TALL_SLOTS; ++i) {
            if (row.computed(i)) {
                const u32 j = row.element(i);
                const float g = gradient<CORPUS>(
                        a, dvd(e.at(shared, i, j), s), j, target, weight_sum,
                        CORPUS ? weights.at(t, i, j, row.inside(i)) : 0.0f);
                adamw_element(step, g, w[i], m[i], v[i]);
            }
        }
#endif
    }

    if (a.finish) {
        float row_max;
        const float s = e.row_sum(row, w, row_max);
        const float big_l = bob_log2(s);
#pragma unroll
        for (u32 i = 0; i < TALL_SLOTS; ++i) {
            if (row.inside(i)) {
                const u32 j = row.element(i);
                const float p = dvd(e.at(shared, i, j), s);
                const float weight = CORPUS ? weights.at(t, i, j, true) : 0.0f;
                a.gradients[base + j] = canonical(gradient<CORPUS>(a, p, j, target, weight_sum,
                                                                   weight));
                const float z = exponent(w[i], row_max, a.log2e);
                if (CORPUS) {
                    shared.kept[j] = mul(sub(big_l, z), weight);  // only this thread read e_j
                } else if (j == target) {
                    a.loss[blockIdx.x] = canonical(mul(a.ln2, sub(big_l, z)));
                }
            }
        }
        if (CORPUS) {
            const float total = row.sum_kept();
            if (threadIdx.x == 0) a.loss[blockIdx.x] = canonical(mul(a.ln2, total));
        } else if (target >= a.vocab && threadIdx.x == 0) {
            a.loss[blockIdx.x] = f32(CANONICAL_NAN);
        }
    }
#pragma unroll
    for (u32 i = 0; i < TALL_SLOTS; ++i) {
        if (row.inside(i)) {
            const u32 j = row.element(i);
            a.parameters[base + j] = canonical(w[i]);
            a.first_moment[base + j] = canonical(m[i]);
            a.second_moment[base + j] = canonical(v[i]);
        }
    }
}

template <bool CORPUS>
static __device__ void fused_train_tall(const FusedArgs& a) {
    __shared__ TallShared shared;
    if (blockDim.x != TALL_THREADS || a.vocab > TALL_VOCAB) __trap();
    if (blockIdx.x >= a.vocab) return;
    // The whole launch takes one branch. At 1024 threads corpus rows always count their
    // elements: with both paths the corpus kernel spilled (8 bytes), and no kernel here may.
    if ((!CORPUS || TALL_CORPUS_FULL) && a.vocab == TALL_VOCAB) {
        fused_tall<CORPUS, true>(a, shared);
    } else {
        fused_tall<CORPUS, false>(a, shared);
    }
}

// The same kernels for rows up to TALL_VOCAB: TALL_THREADS threads, one block per SM (the
// plan uses them from program.bob.TALL_FROM_VOCAB, where they overtake streaming).
#if !TALL_MODE_CORPUS
extern "C" __global__ TALL_BOUNDS void bob_fused_train_tall_hard(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    fused_train_tall<false>(a);
}
#else
extern "C" __global__ TALL_BOUNDS void bob_fused_train_tall_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    fused_train_tall<true>(a);
}
#endif

// This inclusion's own macros go, so the other mode's inclusion defines its own.
#undef TALL_VOCAB
#undef TALL_SLOTS
#undef TALL_PARTS
#undef TALL_WARPS
#undef LANE_ELEMENTS
#undef TALL_BOUNDS
#ifdef TALL_HOLD_WEIGHTS_HERE
#undef TALL_HOLD_WEIGHTS
#undef TALL_HOLD_WEIGHTS_HERE
#endif
#ifdef TALL_CORPUS_FULL_HERE
#undef TALL_CORPUS_FULL
#undef TALL_CORPUS_FULL_HERE
#endif
#ifdef TALL_EVERY_WARP_TREE_HERE
#undef TALL_EVERY_WARP_TREE
#undef TALL_EVERY_WARP_TREE_HERE
#endif
#ifdef TALL_REGISTER_CHAIN_HERE
#undef TALL_REGISTER_CHAIN
#undef TALL_REGISTER_CHAIN_HERE
#endif
#ifdef TALL_FAST_DIVIDE_HERE
#undef TALL_FAST_DIVIDE
#undef TALL_FAST_DIVIDE_HERE
#endif
#ifdef TALL_FAST_CHUNK_HERE
#undef TALL_FAST_CHUNK
#undef TALL_FAST_CHUNK_HERE
#endif
