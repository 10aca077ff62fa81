# Seed 001's programs (examples/dtensor_*.c) run under the launcher, sizes
# shrunk from the seed's (which stay the examples' defaults) so each run
# takes about a second: the placement demo on 6 ranks, and the MLP in every
# mode, each compared with a single-process run (bound 1e-5, see the
# example's header comment).
if(TARGET example_dtensor_placements AND TARGET example_dtensor_mlp)
  add_test(NAME examples/dtensor_placements
           COMMAND dtrain_cli run -n 6 -- $<TARGET_FILE:example_dtensor_placements>)
  set(DT_MLP_SMALL --batch 4 --seq 8 --hidden 32 --ffn 64 --steps 3)
  foreach(mode dp tp dp_tp)
    add_test(NAME examples/dtensor_mlp_${mode}
             COMMAND dtrain_cli run -n 4 -- $<TARGET_FILE:example_dtensor_mlp> --mode ${mode} ${DT_MLP_SMALL})
  endforeach()
  add_test(NAME examples/dtensor_mlp_dp_zero
           COMMAND dtrain_cli run -n 4 -- $<TARGET_FILE:example_dtensor_mlp> --mode dp --zero ${DT_MLP_SMALL})
  add_test(NAME examples/dtensor_mlp_pp
           COMMAND dtrain_cli run -n 8 -- $<TARGET_FILE:example_dtensor_mlp> --mode pp ${DT_MLP_SMALL})
  set_tests_properties(examples/dtensor_placements examples/dtensor_mlp_dp examples/dtensor_mlp_tp
                       examples/dtensor_mlp_dp_tp examples/dtensor_mlp_dp_zero examples/dtensor_mlp_pp
                       PROPERTIES TIMEOUT 120 LABELS "examples;parallel")
endif()

# The README's plan example: GPT-2 over dp 2 x tp 2 x pp 2 ranks with ZeRO-1,
# built by dt_plan (a few seconds), and one process.
if(TARGET example_plan)
  add_test(NAME examples/plan_dp2_tp2_pp2 COMMAND dtrain_cli run -n 8 -- $<TARGET_FILE:example_plan> 2 2 2)
  add_test(NAME examples/plan_one_process COMMAND example_plan)
  set_tests_properties(examples/plan_dp2_tp2_pp2 examples/plan_one_process
                       PROPERTIES TIMEOUT 120 LABELS "examples;parallel")
endif()
