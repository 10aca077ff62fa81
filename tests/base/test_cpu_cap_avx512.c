/* DT_MAX_CPU_ISA=avx512: AVX-512 stays, AMX goes, so bf16 matmuls stay on
 * oneDNN instead of dtrain's AMX GEMM (and `dtrain info` says why). The cap
 * is read once per process, so this program sets it before anything asks. */
#include "test.h"

#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <stdlib.h>

TEST(avx512_cap_turns_amx_off)
{
    ASSERT_EQ_INT(dt_cpu_max_isa(), DT_CPU_ISA_AVX512);
    ASSERT_STR_EQ(dt_cpu_isa_cap_name(dt_cpu_max_isa()), "avx512");
    dt_cpu_features hw = dt_cpu_detect_hw(), f = dt_cpu_detect();
    ASSERT(!f.amx_tile && !f.amx_bf16);
    ASSERT_EQ_INT(f.avx512f, hw.avx512f); /* AVX-512 is not capped */
    ASSERT_EQ_INT(f.avx512_bf16, hw.avx512_bf16);
    const char *why = NULL;
    ASSERT(!dt_k_matmul_amx(&why));
    if (hw.amx_tile && hw.amx_bf16)
        ASSERT_STR_CONTAINS(why, "DT_MAX_CPU_ISA");
    printf("AMX on the CPU: %s; dtrain's AMX GEMM: off (%s)\n", hw.amx_tile && hw.amx_bf16 ? "yes" : "no", why);
}

int main(void)
{
    setenv("DT_MAX_CPU_ISA", "avx512", 1);
    RUN(avx512_cap_turns_amx_off);
    return TEST_REPORT();
}
