// -- cluster: a row past one SM held by a thread-block cluster, for all of a launch --------
//
// A row of V past TALL_VOCAB does not fit one SM, but it fits a cluster of C CTAs on C SMs
// (distributed shared memory, sm_90): CTA c holds tree lanes c L .. c L + L - 1, L = 256 / C,
// so its slice is the row's columns j with j % 256 in that range, L contiguous columns in
// every 256. Local position k = L n + lambda is column j = 256 n + c L + lambda: lane
// c L + lambda's chain position n. A lane's chain (the row sum, the corpus weight sum and
// loss, the literal max) is one thread's fold in order over its k, in its own CTA; the
// tree over the 256 lane partials is run by warp 0 of every CTA on partials read across
// the cluster (ld.shared::cluster), so every CTA gets the same bits, the lane order's. The
// max is the integer max of order keys over the cluster, the literal tree for a zero.
//
// w, m and v stay in shared memory for all of the launch's updates of the row, with the
// exponentials of the current update: DRAM is read and written once per row per launch. A
// corpus row's weights are only read: where the launch's dynamic shared memory has room for
// a fifth array they are held too, and where it does not each update reads them again from
// global memory, where after the first update the cluster's rows in flight find them in L2
// (each thread asks for its next quad's weights a quad ahead). So a corpus slice needs
// hard's four arrays, and at V = 50257 a row fits a cluster of half the CTAs it would need
// with the weights held. A cluster exchange is one cluster barrier: each CTA writes its
// partials (or its max key) into its own shared memory, by turn (exchanges alternate two
// buffers, so a buffer is written again only after the exchange between has been passed by
// all).
// The grid is clusters of C CTAs; cluster g takes rows g, g + G, ... (G clusters): any G
// gives the same bits. The plan sizes C (a power of two; the fewest whose slices fit the
// target's shared memory) and G (the clusters the target's SMs hold at once); the kernel
// traps where the launch's dynamic shared memory does not hold its slice. Clusters are
// sm_90's: on older targets the entries only trap (the program never chooses them there).
#ifndef CLUSTER_THREADS
#define CLUSTER_THREADS 512u
#endif
#ifndef CLUSTER_FOLD_BATCH
#define CLUSTER_FOLD_BATCH 16u  // a lane's chain positions loaded together
#endif
// Timing experiments only (wrong results): no cross-CTA exchange, no lane folds.
#ifndef CLUSTER_TIMING_NO_EXCHANGE
#define CLUSTER_TIMING_NO_EXCHANGE 0
#endif
#ifndef CLUSTER_TIMING_NO_FOLD
#define CLUSTER_TIMING_NO_FOLD 0
#endif
// 1: the last L threads fold the exponentials round by round while the others compute
// them, one barrier a round (ClusterRow::exponentials_sum; measured slower).
#ifndef CLUSTER_PIPELINED_FOLD
#define CLUSTER_PIPELINED_FOLD 0
#endif
#define CLUSTER_WARPS (CLUSTER_THREADS / WARP)
#define CLUSTER_BOUNDS __launch_bounds__(CLUSTER_THREADS, 1)

#if __CUDA_ARCH__ >= 900
static __device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ u32 cluster_ctas() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ u32 cluster_index() {
    u32 r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ u32 cluster_count() {
    u32 r;
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster: writes before, reads after (release, acquire).
static __device__ __forceinline__ void cluster_barrier() {
#if CLUSTER_TIMING_NO_EXCHANGE
    __syncthreads();
    return;
#endif
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The 32 bits at `local`'s place in CTA `rank`'s shared memory.
static __device__ __forceinline__ u32 remote_bits(const void* local, u32 rank) {
#if CLUSTER_TIMING_NO_EXCHANGE
    rank = cluster_rank();
#endif
    const u32 address = (u32)__cvta_generic_to_shared(local);
    u32 remote, x;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(x) : "r"(remote) : "memory");
    return x;
}

struct __align__(16) ClusterShared {
    float partials[2][LANES];  // this CTA's lanes' partials (its first L), by turn
    int key[2];  // this CTA's max key, by turn
    int warp_keys[CLUSTER_WARPS];
    float scalars[2 * CLUSTER_THREADS];  // StagedScalars
    float result;
};

template <bool CORPUS>
struct ClusterRow {
    const FusedArgs& a;
    ClusterShared& shared;
    float4 *w, *m, *v, *e;  // the slice's quads: `quads` each, in dynamic shared memory
    u32 rank, lane_bits, chain, quads;  // L = 1 << lane_bits; chain = ceil(V / 256)
    u32 turn;
    float4* t;  // the corpus weights' quads where they are held, else nullptr

    __device__ u32 lanes() const { return 1u << lane_bits; }
    // Column of local position k.
    __device__ u32 column(u32 k) const {
        return LANES * (k >> lane_bits) + (rank << lane_bits) + (k & (lanes() - 1u));
    }

    // The tree over the 256 lane partials of every CTA (each wrote its own, this turn).
    template <typename Op>
    __device__ float tree(Op op) {
        cluster_barrier();
        if (threadIdx.x < WARP) {
            float p[8];
#pragma unroll
            for (u32 i = 0; i < 8; ++i) {
                const u32 l = threadIdx.x + WARP * i;
                p[i] = __uint_as_float(remote_bits(&shared.partials[turn][l & (lanes() - 1u)],
                                                   l >> lane_bits));
            }
#pragma unroll
            for (u32 i = 0; i < 4; ++i) p[i] = op(p[i], p[i + 4]);  // s = 128
            p[0] = op(p[0], p[2]);  // s = 64
            p[1] = op(p[1], p[3]);
            float x = op(p[0], p[1]);  // s = 32
#pragma unroll
            for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_down_sync(FULL_WARP, x, s));
            if (threadIdx.x == 0) shared.result = x;
        }
        __syncthreads();
        turn ^= 1u;
        return shared.result;
    }

    // Each of this CTA's lanes folds its chain of x (written before a barrier) from `start`:
    // CLUSTER_FOLD_BATCH positions loaded together, then added in order.
    template <typename Op>
    __device__ void fold_lanes(const float4* x, float start, Op op) {
        if (threadIdx.x < lanes()) {
            const float* values = (const float*)x + threadIdx.x;
            const u32 first = (rank << lane_bits) + threadIdx.x;  // column of position n = 0
            const u32 inside = first < a.vocab ? (a.vocab - first + LANES - 1u) / LANES : 0u;
            float acc = start;
#if CLUSTER_TIMING_NO_FOLD
            (void)values; (void)inside;
#else
            // The next batch is loaded while this one is added.
            float batch[CLUSTER_FOLD_BATCH], next[CLUSTER_FOLD_BATCH];
#pragma unroll
            for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) {
                next[b] = b < inside ? values[b << lane_bits] : 0.0f;
            }
            for (u32 n0 = 0; n0 < inside; n0 += CLUSTER_FOLD_BATCH) {
#pragma unroll
                for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) batch[b] = next[b];
                const u32 n1 = n0 + CLUSTER_FOLD_BATCH;
#pragma unroll
                for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) {
                    next[b] = n1 + b < inside ? values[(n1 + b) << lane_bits] : 0.0f;
                }
#pragma unroll
                for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) {
                    if (n0 + b < inside) acc = op(acc, batch[b]);
                }
            }
#endif
            shared.partials[turn][threadIdx.x] = acc;
        }
    }

    __device__ float sum(const float4* x) {
        __syncthreads();
        fold_lanes(x, 0.0f, SumOp());
        return tree(SumOp());
    }

#if CLUSTER_PIPELINED_FOLD
    // e = the exponentials of w against row_max, and their row sum. The last L threads are
    // the lanes: while the others compute round r + 1's quads, they fold round r's chain
    // positions (a round of W quads is 4 W / L whole positions), one barrier a round.
    __device__ float exponentials_sum(float row_max) {
        const u32 workers = CLUSTER_THREADS - lanes();
        const u32 rounds = (quads + workers - 1u) / workers;
        const u32 per_round = (4u * workers) >> lane_bits;
        const bool folding = threadIdx.x >= workers;
        const u32 lane = threadIdx.x - workers;
        const float* values = (const float*)e + lane;
        const u32 first = (rank << lane_bits) + lane;
        const u32 inside = folding && first < a.vocab ? (a.vocab - first + LANES - 1u) / LANES
                                                      : 0u;
        float acc = 0.0f;
        for (u32 r = 0; r <= rounds; ++r) {
            if (!folding) {
                const u32 q = threadIdx.x + workers * r;
                if (q < quads) {
                    const float4 wq = w[q];
                    float x[4];
#pragma unroll
                    for (u32 c = 0; c < 4u; ++c) {
                        x[c] = bob_exp2(exponent(part(wq, c), row_max, a.log2e));
                    }
                    e[q] = make_float4(x[0], x[1], x[2], x[3]);
                }
            } else if (r > 0) {
                const u32 n0 = per_round * (r - 1u);
                const u32 n1 = min(n0 + per_round, inside);
                for (u32 b0 = n0; b0 < n1; b0 += CLUSTER_FOLD_BATCH) {
                    float batch[CLUSTER_FOLD_BATCH];
#pragma unroll
                    for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) {
                        batch[b] = b0 + b < n1 ? values[(b0 + b) << lane_bits] : 0.0f;
                    }
#pragma unroll
                    for (u32 b = 0; b < CLUSTER_FOLD_BATCH; ++b) {
                        if (b0 + b < n1) acc = add(acc, batch[b]);
                    }
                }
            }
            if (r < rounds) __syncthreads();
        }
        if (folding) shared.partials[turn][lane] = acc;
        return tree(SumOp());
    }
#endif

    // The row max of w from `held`, each thread's select_max of its inside elements.
    __device__ float max(float held) {
        const int key = __reduce_max_sync(FULL_WARP, order_key(held));
        if (threadIdx.x % WARP == 0) shared.warp_keys[threadIdx.x / WARP] = key;
        __syncthreads();
        if (threadIdx.x < WARP) {
            const int mine = threadIdx.x < CLUSTER_WARPS ? shared.warp_keys[threadIdx.x]
                                                         : order_key(f32(NEG_INF));
            const int block = __reduce_max_sync(FULL_WARP, mine);
            if (threadIdx.x == 0) shared.key[turn] = block;
        }
        cluster_barrier();
        if (threadIdx.x < WARP) {
            const u32 ctas = cluster_ctas();
            const int theirs = threadIdx.x < ctas ? (int)remote_bits(&shared.key[turn], threadIdx.x)
                                                  : order_key(f32(NEG_INF));
            const int row = __reduce_max_sync(FULL_WARP, theirs);
            if (threadIdx.x == 0) shared.result = from_order_key(row);
        }
        __syncthreads();
        turn ^= 1u;
        const float m_row = shared.result;
        if (m_row != 0.0f) return m_row;  // uniform over the cluster
        fold_lanes(w, f32(NEG_INF), MaxOp());  // a zero: whose sign the lane order decides
        return tree(MaxOp());
    }
};

static __device__ __forceinline__ float4 quad(const float (&x)[4]) {
    return make_float4(x[0], x[1], x[2], x[3]);
}

// The corpus weights of the quad at column j0 of the row at `base`, from global memory
// (element by element: a row of V % 4 != 0 starts anywhere).
static __device__ __forceinline__ float4 weights_quad(const FusedArgs& a, u64 base, u32 j0) {
    float t[4];
#pragma unroll
    for (u32 c = 0; c < 4u; ++c) {
        t[c] = j0 + c < a.vocab ? __ldg(a.weights + base + j0 + c) : 0.0f;
    }
    return quad(t);
}

// The corpus weights of quad q (at column j0): held, or read from global memory.
template <bool CORPUS, bool HELD>
static __device__ __forceinline__ float4 row_weights(const FusedArgs& a,
                                                     const ClusterRow<CORPUS>& row, u64 base,
                                                     u32 q, u32 j0) {
    if (!CORPUS) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return HELD ? row.t[q] : weights_quad(a, base, j0);
}

// The finish of row r from its final w (e and s of it): the gradients stored, and the loss.
template <bool CORPUS, bool HELD>
static __device__ void finish_row(const FusedArgs& a, ClusterRow<CORPUS>& row, u64 base, u32 r,
                                  u32 target, float weight_sum, float s, float row_max) {
    const float big_l = bob_log2(s);
    for (u32 q = threadIdx.x; q < row.quads; q += CLUSTER_THREADS) {
        const u32 j0 = row.column(4u * q);
        const float4 wq = row.w[q], eq = row.e[q];
        const float4 tq = row_weights<CORPUS, HELD>(a, row, base, q, j0);
        float terms[4];
#pragma unroll
        for (u32 c = 0; c < 4u; ++c) {
            terms[c] = 0.0f;
            const u32 j = j0 + c;
            if (j < a.vocab) {
                const float g = gradient<CORPUS>(a, dvd(part(eq, c), s), j, target, weight_sum,
                                                 part(tq, c));
                a.gradients[base + j] = canonical(g);
                const float z = exponent(part(wq, c), row_max, a.log2e);
                if (CORPUS) {
                    terms[c] = mul(sub(big_l, z), part(tq, c));
                } else if (j == target) {
                    a.loss[r] = canonical(mul(a.ln2, sub(big_l, z)));
                }
            }
        }
        if (CORPUS) row.e[q] = quad(terms);  // only this thread reads these e in this pass
    }
    if (CORPUS) {
        const float total = row.sum(row.e);
        if (row.rank == 0 && threadIdx.x == 0) a.loss[r] = canonical(mul(a.ln2, total));
    } else if (target >= a.vocab && row.rank == 0 && threadIdx.x == 0) {
        a.loss[r] = f32(CANONICAL_NAN);
    }
}

// The cluster's rows, each for all of the launch's updates; HELD: the weights held in t.
template <bool CORPUS, bool HELD>
static __device__ void cluster_rows(const FusedArgs& a, ClusterRow<CORPUS>& row,
                                    StagedScalars& scalars) {
    const u32 quads = row.quads;
    for (u32 r = cluster_index(); r < a.vocab; r += cluster_count()) {
        const u64 base = (u64)r * a.vocab;
        const u32 target = CORPUS ? 0u : a.targets[r];
        float held = f32(NEG_INF);
        for (u32 q = threadIdx.x; q < quads; q += CLUSTER_THREADS) {
            const u32 j0 = row.column(4u * q);
            float w[4], m[4], v[4], t[4];
#pragma unroll
            for (u32 c = 0; c < 4u; ++c) {
                const bool inside = j0 + c < a.vocab;
                w[c] = inside ? a.parameters[base + j0 + c] : f32(NEG_INF);
                m[c] = inside ? a.first_moment[base + j0 + c] : 0.0f;
                v[c] = inside ? a.second_moment[base + j0 + c] : 0.0f;
                t[c] = CORPUS && inside ? a.weights[base + j0 + c] : 0.0f;
                if (inside) held = select_max(held, w[c]);
            }
            row.w[q] = quad(w);
            row.m[q] = quad(m);
            row.v[q] = quad(v);
            if (CORPUS) (HELD ? row.t : row.e)[q] = quad(t);  // e is free until the first sum
        }
        const float weight_sum = CORPUS ? row.sum(HELD ? row.t : row.e) : 0.0f;
        float row_max = row.max(held);

        for (u32 k = 0; k <= a.updates; ++k) {
            const bool finishing = k == a.updates;
            if (finishing && !a.finish) break;
            if (!finishing) scalars.stage(a, k);
            // Streamed weights: a thread's first quad asked for now, under the sum's folds.
            float4 t_ahead = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (CORPUS && !HELD && !finishing && threadIdx.x < quads) {
                t_ahead = weights_quad(a, base, row.column(4u * threadIdx.x));
            }
#if CLUSTER_PIPELINED_FOLD
            const float s = row.exponentials_sum(row_max);
#else
            for (u32 q = threadIdx.x; q < quads; q += CLUSTER_THREADS) {
                const float4 wq = row.w[q];
                float e[4];
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) e[c] = bob_exp2(exponent(part(wq, c), row_max, a.log2e));
                row.e[q] = quad(e);
            }
            const float s = row.sum(row.e);
#endif
            if (finishing) {
                finish_row<CORPUS, HELD>(a, row, base, r, target, weight_sum, s, row_max);
                break;
            }
            const AdamStep step = scalars.step(a, k);  // after the sum's barriers
            held = f32(NEG_INF);
            for (u32 q = threadIdx.x; q < quads; q += CLUSTER_THREADS) {
                const u32 j0 = row.column(4u * q);
                const float4 wq = row.w[q], mq = row.m[q], vq = row.v[q], eq = row.e[q];
                const float4 tq = HELD ? row_weights<CORPUS, HELD>(a, row, base, q, j0)
                                       : t_ahead;
                if (CORPUS && !HELD && q + CLUSTER_THREADS < quads) {
                    t_ahead = weights_quad(a, base, row.column(4u * (q + CLUSTER_THREADS)));
                }
                float w[4], m[4], v[4], e[4], t[4];
                u32 j[4];
                bool inside[4];
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    w[c] = part(wq, c);
                    m[c] = part(mq, c);
                    v[c] = part(vq, c);
                    e[c] = part(eq, c);
                    t[c] = part(tq, c);
                    j[c] = j0 + c;
                    inside[c] = j0 + c < a.vocab;
                }
                adamw_together<CORPUS, 4>(a, step, e, s, j, inside, target, weight_sum, t, w,
                                          m, v);
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    if (inside[c]) held = select_max(held, w[c]);
                }
                row.w[q] = quad(w);
                row.m[q] = quad(m);
                row.v[q] = quad(v);
            }
            row_max = row.max(held);
        }

        for (u32 q = threadIdx.x; q < quads; q += CLUSTER_THREADS) {
            const u32 j0 = row.column(4u * q);
            const float4 wq = row.w[q], mq = row.m[q], vq = row.v[q];
#pragma unroll
            for (u32 c = 0; c < 4u; ++c) {
                if (j0 + c < a.vocab) {
                    a.parameters[base + j0 + c] = canonical(part(wq, c));
                    a.first_moment[base + j0 + c] = canonical(part(mq, c));
                    a.second_moment[base + j0 + c] = canonical(part(vq, c));
                }
            }
        }
    }
}

template <bool CORPUS>
static __device__ void fused_cluster(const FusedArgs& a) {
    __shared__ ClusterShared shared;
    extern __shared__ float4 slices[];
    const u32 ctas = cluster_ctas();
    const u32 lane_bits = 8u - (31u - __clz(ctas));  // L = 256 / C, C a power of two
    const u32 chain = (a.vocab + LANES - 1u) / LANES;
    const u32 quads = (chain << lane_bits) / 4u;
    const u32 arrays = 4u;  // w, m, v, e
    if ((ctas & (ctas - 1u)) != 0u || ctas > LANES / 4u
        || dynamic_shared_bytes() < arrays * quads * 16u) {
        __trap();
    }
    // The same bytes either way (the same weights, the same order); held is faster where
    // they fit beside the four, streamed only lets a row fit fewer CTAs.
    const bool held = CORPUS && dynamic_shared_bytes() >= (arrays + 1u) * quads * 16u;
    ClusterRow<CORPUS> row{a, shared, slices, slices + quads, slices + 2u * quads,
                           slices + 3u * quads, cluster_rank(), lane_bits, chain, quads, 0u,
                           held ? slices + 4u * quads : nullptr};
    StagedScalars scalars{shared.scalars, CLUSTER_THREADS};
    if (held) {
        cluster_rows<CORPUS, true>(a, row, scalars);
    } else {
        cluster_rows<CORPUS, false>(a, row, scalars);
    }
    cluster_barrier();  // no CTA leaves while another may read its shared memory
}
#endif  // __CUDA_ARCH__ >= 900

extern "C" __global__ CLUSTER_BOUNDS void bob_fused_train_cluster_hard(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
#if __CUDA_ARCH__ >= 900
    if (blockDim.x != CLUSTER_THREADS) __trap();
    fused_cluster<false>(a);
#else
    (void)a;
    __trap();
#endif
}

extern "C" __global__ CLUSTER_BOUNDS void bob_fused_train_cluster_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
#if __CUDA_ARCH__ >= 900
    if (blockDim.x != CLUSTER_THREADS) __trap();
    fused_cluster<true>(a);
#else
    (void)a;
    __trap();
#endif
}
