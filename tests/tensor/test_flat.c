/* Typed flat buffers: padding to a multiple of the world size (each shard
 * 64-byte aligned), shard and range views with global indices, wrapping
 * caller memory, bad arguments. */
#include "dtrain/tensor.h"
#include "test.h"

#include <stdint.h>
#include <string.h>

/* For several dtypes and world sizes: total is a multiple of world and of
 * the elements per 64 bytes; shards tile the buffer exactly, start 64-byte
 * aligned and address the same memory as the full buffer. */
TEST(padding_and_shards)
{
    const dt_dtype types[] = {DT_F32, DT_BF16, DT_I64, DT_U8, DT_F64};
    const size_t useds[] = {0, 1, 15, 16, 17, 1000, 4099};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ui = 0; ui < sizeof useds / sizeof useds[0]; ui++)
            for (int world = 1; world <= 8; world++) {
                dt_dtype t = types[ti];
                size_t esz = dt_dtype_size(t), used = useds[ui];
                dt_flat f;
                ASSERT_OK(dt_flat_alloc(&f, t, used, world, NULL));
                ASSERT_EQ_INT(f.total, dt_flat_padded(t, used, world));
                ASSERT(f.total >= used);
                ASSERT_EQ_INT(f.total % (size_t)world, 0);
                ASSERT_EQ_INT((f.total / (size_t)world * esz) % 64, 0);
                /* the smallest such size */
                ASSERT(f.total - used < (size_t)world * (64 / esz));
                ASSERT_EQ_INT(f.used, used);
                ASSERT_EQ_INT(f.numel, f.total);
                ASSERT_EQ_INT(f.offset, 0);
                ASSERT(f.owned);
                ASSERT(used == 0 || ((uintptr_t)f.base % 64) == 0);
                for (size_t i = 0; i < dt_flat_nbytes(&f); i++)
                    ASSERT_EQ_INT(((unsigned char *)f.base)[i], 0);
                size_t next = 0;
                for (int r = 0; r < world; r++) {
                    dt_flat s;
                    ASSERT_OK(dt_flat_shard(&f, r, world, &s));
                    ASSERT_EQ_INT(s.offset, next);
                    ASSERT_EQ_INT(s.numel, f.total / (size_t)world);
                    ASSERT(!s.owned);
                    ASSERT_EQ_INT(s.dtype, t);
                    ASSERT(s.numel == 0 || s.base == dt_flat_ptr(&f, s.offset));
                    ASSERT(s.numel == 0 || ((uintptr_t)s.base % 64) == 0);
                    /* global indexing: the first and last element of the shard */
                    if (s.numel) {
                        ASSERT(dt_flat_ptr(&s, s.offset) == dt_flat_ptr(&f, s.offset));
                        ASSERT(dt_flat_ptr(&s, s.offset + s.numel - 1) ==
                               (char *)f.base + (s.offset + s.numel - 1) * esz);
                        ASSERT(dt_flat_ptr(&s, s.offset + s.numel) == NULL);
                        ASSERT(s.offset == 0 || dt_flat_ptr(&s, s.offset - 1) == NULL);
                    }
                    /* freeing a view leaves the buffer alone */
                    dt_flat_free(&s);
                    next += f.total / (size_t)world;
                }
                ASSERT_EQ_INT(next, f.total);
                dt_flat_free(&f);
                ASSERT(f.base == NULL && f.total == 0);
            }
}

/* The numbers of one case, spelled out (the header's example). */
TEST(worked_example)
{
    dt_flat f, s;
    ASSERT_OK(dt_flat_alloc(&f, DT_F32, 1000, 3, NULL));
    ASSERT_EQ_INT(f.total, 1008); /* 3 shards of 336 floats = 1344 bytes = 21 * 64 */
    ASSERT_OK(dt_flat_shard(&f, 1, 3, &s));
    ASSERT_EQ_INT(s.offset, 336);
    ASSERT_EQ_INT(s.numel, 336);
    ((float *)f.base)[400] = 2.5f;
    ASSERT_NEAR(*(float *)dt_flat_ptr(&s, 400), 2.5, 0, 0);
    ASSERT(dt_flat_ptr(&s, 335) == NULL);
    /* a range of a shard, and a shard of a shard is refused */
    dt_flat r;
    ASSERT_OK(dt_flat_range(&s, 400, 410, &r));
    ASSERT_NEAR(*(float *)r.base, 2.5, 0, 0);
    ASSERT_STATUS(dt_flat_range(&s, 300, 410, &r), DT_ERR_RANGE);
    ASSERT_STATUS(dt_flat_shard(&s, 0, 3, &r), DT_ERR_RANGE);
    /* a world the buffer was not padded for */
    ASSERT_STATUS(dt_flat_shard(&f, 0, 5, &r), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_flat_shard(&f, 3, 3, &r), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_flat_shard(&f, -1, 3, &r), DT_ERR_INVALID_ARG);
    dt_flat_free(&f);
    /* i64: 8 per 64 bytes */
    ASSERT_OK(dt_flat_alloc(&f, DT_I64, 3, 2, NULL));
    ASSERT_EQ_INT(f.total, 16);
    ASSERT_EQ_INT((char *)dt_flat_ptr(&f, 9) - (char *)f.base, 72);
    dt_flat_free(&f);
}

TEST(wrap_and_bad_arguments)
{
    float mem[10] = {0};
    dt_flat f;
    ASSERT_OK(dt_flat_wrap(&f, DT_F32, mem, 10));
    ASSERT(!f.owned && f.total == 10 && f.world == 1);
    ASSERT(dt_flat_ptr(&f, 9) == &mem[9]);
    dt_flat_free(&f); /* a wrap does not own: mem is not freed */
    ASSERT_STATUS(dt_flat_wrap(&f, DT_F32, NULL, 3), DT_ERR_NULL);
    ASSERT_OK(dt_flat_wrap(&f, DT_F32, NULL, 0));
    ASSERT_STATUS(dt_flat_wrap(&f, DT_DTYPE_COUNT, mem, 3), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_flat_alloc(NULL, DT_F32, 3, 1, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_flat_alloc(&f, DT_F32, 3, 0, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_flat_alloc(&f, DT_DTYPE_COUNT, 3, 1, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_flat_alloc(&f, DT_F32, SIZE_MAX / 2, 1, NULL), DT_ERR_RANGE);
    /* the padding's round-up wrapped to a total of 0: DT_OK with used SIZE_MAX and no memory */
    ASSERT_EQ_INT(dt_flat_padded(DT_F32, SIZE_MAX, 1), SIZE_MAX);
    ASSERT_EQ_INT(dt_flat_padded(DT_F32, SIZE_MAX - 20, 3), SIZE_MAX);
    ASSERT_EQ_INT(dt_flat_padded(DT_F32, SIZE_MAX - 15, 1), SIZE_MAX - 15); /* a multiple of 16 */
    ASSERT_STATUS(dt_flat_alloc(&f, DT_F32, SIZE_MAX, 1, NULL), DT_ERR_RANGE);
    ASSERT_STATUS(dt_flat_alloc(&f, DT_U8, SIZE_MAX - 3, 1, NULL), DT_ERR_RANGE);
    ASSERT_STATUS(dt_flat_wrap(&f, DT_F32, mem, SIZE_MAX), DT_ERR_RANGE);
    ASSERT_STATUS(dt_flat_wrap(&f, DT_F64, mem, (size_t)PTRDIFF_MAX / 4), DT_ERR_RANGE);
    ASSERT_STATUS(dt_flat_shard(NULL, 0, 1, &f), DT_ERR_NULL);
    ASSERT(dt_flat_ptr(NULL, 0) == NULL);
    ASSERT_EQ_INT(dt_flat_nbytes(NULL), 0);
    dt_flat_free(NULL);
}

int main(void)
{
    RUN(padding_and_shards);
    RUN(worked_example);
    RUN(wrap_and_bad_arguments);
    return TEST_REPORT();
}
