// Bob's entry points with the signatures of bob.kernels.signatures and
// placeholder bodies: enough to test reading regions from an image.

extern "C" __global__ void bob_row_gather(float* logits, const unsigned int* prompt,
                                          const float* table, unsigned int vocab)
{
    if (threadIdx.x < vocab) logits[threadIdx.x] = table[prompt[0] * vocab + threadIdx.x];
}

extern "C" __global__ void bob_loss_gradient_hard(const float* parameters, float* gradients,
                                                  const unsigned int* targets, float* loss,
                                                  float log2e, float ln2, float inverse_rows,
                                                  unsigned int vocab)
{
    __shared__ float lanes[256];
    lanes[threadIdx.x] = parameters[blockIdx.x * vocab] * log2e;
    __syncthreads();
    if (threadIdx.x == 0) loss[blockIdx.x] = lanes[targets[blockIdx.x] % 256] * ln2;
    gradients[blockIdx.x * vocab] = inverse_rows;
}

extern "C" __global__ void bob_loss_gradient_corpus(const float* parameters, float* gradients,
                                                    const float* weights, float* loss,
                                                    float log2e, float ln2, unsigned int vocab)
{
    if (threadIdx.x == 0) loss[blockIdx.x] = parameters[blockIdx.x * vocab] * log2e * ln2;
    gradients[blockIdx.x * vocab] = weights[blockIdx.x * vocab];
}

extern "C" __global__ void bob_adamw(float* parameters, const float* gradients,
                                     float* first_moment, float* second_moment, float decay,
                                     float beta1, float one_minus_beta1, float beta2,
                                     float one_minus_beta2, float step_size, float eps_hat,
                                     unsigned int rows, unsigned int columns)
{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (unsigned long long)rows * columns) {
        float g = gradients[i];
        first_moment[i] = beta1 * first_moment[i] + one_minus_beta1 * g;
        second_moment[i] = beta2 * second_moment[i] + one_minus_beta2 * g * g;
        parameters[i] = decay * parameters[i] - step_size * first_moment[i] /
                        (sqrtf(second_moment[i]) + eps_hat);
    }
}

extern "C" __global__ void bob_greedy_argmax(unsigned int* prediction, const float* row,
                                             unsigned int vocab)
{
    if (threadIdx.x == 0) prediction[0] = row[0] > row[vocab - 1] ? 0u : vocab - 1;
}

extern "C" __global__ void bob_fused_train_hard(float* parameters, float* first_moment,
                                                float* second_moment, float* gradients,
                                                const unsigned int* targets, float* loss,
                                                const float* adam_scalars, float log2e,
                                                float ln2, float inverse_rows,
                                                unsigned int vocab, unsigned int updates,
                                                unsigned int finish)
{
    __shared__ float lanes[512];
    lanes[threadIdx.x] = parameters[blockIdx.x * vocab] * adam_scalars[updates];
    __syncthreads();
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = lanes[targets[0] % 256] * log2e;
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_corpus(float* parameters, float* first_moment,
                                                  float* second_moment, float* gradients,
                                                  const float* weights, float* loss,
                                                  const float* adam_scalars, float log2e,
                                                  float ln2, unsigned int vocab,
                                                  unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_fused_train_wide_hard(float* parameters, float* first_moment,
                                                     float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, float log2e,
                                                     float ln2, float inverse_rows,
                                                     unsigned int vocab, unsigned int updates,
                                                     unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[targets[0]] = adam_scalars[updates] * log2e;
    if (finish) loss[blockIdx.x] = gradients[vocab] = parameters[0] * ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_wide_corpus(float* parameters, float* first_moment,
                                                       float* second_moment, float* gradients,
                                                       const float* weights, float* loss,
                                                       const float* adam_scalars, float log2e,
                                                       float ln2, unsigned int vocab,
                                                       unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_fused_train_tall_hard(float* parameters, float* first_moment,
                                                     float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, float log2e,
                                                     float ln2, float inverse_rows,
                                                     unsigned int vocab, unsigned int updates,
                                                     unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[targets[0]] = adam_scalars[updates] * log2e;
    if (finish) loss[blockIdx.x] = gradients[vocab] = parameters[0] * ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_tall_corpus(float* parameters, float* first_moment,
                                                       float* second_moment, float* gradients,
                                                       const float* weights, float* loss,
                                                       const float* adam_scalars, float log2e,
                                                       float ln2, unsigned int vocab,
                                                       unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_fused_train_stream_hard(float* parameters, float* first_moment,
                                                       float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, float log2e,
                                                     float ln2, float inverse_rows,
                                                     unsigned int vocab, unsigned int updates,
                                                     unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[targets[0]] = adam_scalars[updates] * log2e;
    if (finish) loss[blockIdx.x] = gradients[vocab] = parameters[0] * ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_stream_corpus(float* parameters, float* first_moment,
                                                         float* second_moment, float* gradients,
                                                       const float* weights, float* loss,
                                                       const float* adam_scalars, float log2e,
                                                       float ln2, unsigned int vocab,
                                                       unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_fused_train_held_hard(float* parameters, float* first_moment,
                                                     float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, float log2e,
                                                     float ln2, float inverse_rows,
                                                     unsigned int vocab, unsigned int updates,
                                                     unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[targets[0]] = adam_scalars[updates] * log2e;
    if (finish) loss[blockIdx.x] = gradients[vocab] = parameters[0] * ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_held_corpus(float* parameters, float* first_moment,
                                                       float* second_moment, float* gradients,
                                                       const float* weights, float* loss,
                                                       const float* adam_scalars, float log2e,
                                                       float ln2, unsigned int vocab,
                                                       unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_fused_train_cluster_hard(float* parameters, float* first_moment,
                                                     float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, float log2e,
                                                     float ln2, float inverse_rows,
                                                     unsigned int vocab, unsigned int updates,
                                                     unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[targets[0]] = adam_scalars[updates] * log2e;
    if (finish) loss[blockIdx.x] = gradients[vocab] = parameters[0] * ln2 * inverse_rows;
}

extern "C" __global__ void bob_fused_train_cluster_corpus(float* parameters, float* first_moment,
                                                       float* second_moment, float* gradients,
                                                       const float* weights, float* loss,
                                                       const float* adam_scalars, float log2e,
                                                       float ln2, unsigned int vocab,
                                                       unsigned int updates, unsigned int finish)
{
    first_moment[blockIdx.x] = second_moment[blockIdx.x] = weights[vocab] * adam_scalars[updates];
    if (finish) loss[blockIdx.x] = gradients[blockIdx.x] = parameters[0] * ln2 * log2e;
}

extern "C" __global__ void bob_health(const float* parameters, const float* first_moment,
                                      const float* second_moment,
                                      unsigned long long* health, unsigned int vocab)
{
    health[blockIdx.x] = parameters[vocab] + first_moment[0] + second_moment[0];
}

extern "C" __global__ void bob_scatter(float* table, const unsigned long long* keys,
                                       const float* values, unsigned int count,
                                       unsigned int vocab)
{
    if (blockIdx.x < count) table[keys[blockIdx.x] % vocab] = values[blockIdx.x];
}

extern "C" __global__ void bob_loss_corpus(const float* parameters, const float* weights,
                                           float* loss, float log2e, float ln2,
                                           unsigned int vocab)
{
    loss[blockIdx.x] = parameters[vocab] * weights[0] * log2e * ln2;
}

// The collapsed tables' regions: tables of V + K classes and their index.
#define INDEX const unsigned int *row_offsets, const unsigned int *columns, \
              const unsigned int *lane_order
#define SIZES unsigned int vocab, unsigned int exceptions, unsigned int classes, \
              unsigned int offsets

extern "C" __global__ void bob_collapsed_gather(float* logits, const unsigned int* prompt,
                                                const float* parameters, INDEX, SIZES)
{
    if (threadIdx.x < vocab) logits[threadIdx.x] = parameters[prompt[0] + row_offsets[0]];
}

extern "C" __global__ void bob_collapsed_loss_gradient(const float* parameters,
                                                       float* gradients,
                                                       const unsigned int* targets, float* loss,
                                                       INDEX, float log2e, float ln2,
                                                       float inverse_rows, SIZES)
{
    loss[blockIdx.x] = parameters[targets[0] + columns[0] + lane_order[0]] * log2e * ln2;
    gradients[blockIdx.x] = inverse_rows;
}

extern "C" __global__ void bob_collapsed_loss_gradient_corpus(const float* parameters,
                                                              float* gradients,
                                                              const float* weights,
                                                              float* loss, INDEX, float log2e,
                                                              float ln2, SIZES)
{
    loss[blockIdx.x] = parameters[columns[0]] * weights[0] * log2e * ln2;
    gradients[blockIdx.x] = weights[lane_order[0]];
}

extern "C" __global__ void bob_collapsed_loss_corpus(const float* parameters,
                                                     const float* weights, float* loss, INDEX,
                                                     float log2e, float ln2, SIZES)
{
    loss[blockIdx.x] = parameters[row_offsets[0]] * weights[columns[0]] * log2e * ln2;
}

extern "C" __global__ void bob_collapsed_fused_train(float* parameters, float* first_moment,
                                                     float* second_moment, float* gradients,
                                                     const unsigned int* targets, float* loss,
                                                     const float* adam_scalars, INDEX,
                                                     float log2e, float ln2,
                                                     float inverse_rows, SIZES,
                                                     unsigned int updates, unsigned int finish)
{
    parameters[0] = first_moment[0] + second_moment[0] + adam_scalars[updates] * log2e * ln2;
    if (finish) loss[0] = gradients[targets[0] + columns[0]] * inverse_rows;
}

extern "C" __global__ void bob_collapsed_fused_train_corpus(
    float* parameters, float* first_moment, float* second_moment, float* gradients,
    const float* weights, float* loss, const float* adam_scalars, INDEX, float log2e,
    float ln2, SIZES, unsigned int updates, unsigned int finish)
{
    parameters[0] = first_moment[0] + second_moment[0] + adam_scalars[updates] * log2e * ln2;
    if (finish) loss[0] = gradients[columns[0]] * weights[0];
}

extern "C" __global__ void bob_collapsed_scatter(float* weights,
                                                 const unsigned long long* keys,
                                                 const float* values,
                                                 const unsigned int* row_offsets,
                                                 const unsigned int* columns,
                                                 unsigned int count, SIZES)
{
    if (threadIdx.x < count) weights[keys[threadIdx.x] % vocab] = values[row_offsets[0]];
}

extern "C" __global__ void bob_collapsed_health(const float* parameters,
                                                const float* first_moment,
                                                const float* second_moment,
                                                unsigned long long* health,
                                                unsigned int classes)
{
    if (threadIdx.x < classes) health[0] += parameters[0] + first_moment[0] + second_moment[0];
}
