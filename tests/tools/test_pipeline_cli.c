/* `dtrain pipeline show`: the table of a schedule with its bubble against
 * the formula (ZB-H1, p 4, m 8: 3 idle units of 24, (p-1)/(3m) = 0.125;
 * interleaved p 2, m 4, v 2: chunks shown), and bad input refused with
 * exit 2 naming the limit or the option. */
#include "test.h"
#include "train_cli.h"

TEST(show_tables)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", "--schedule", "zbh1", "-p", "4", "-m", "8", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "schedule zbh1: p 4, m 8, v 1 (4 stages)");
    ASSERT_STR_CONTAINS(r.out, "bubble 0.125 of ideal (formula 0.125)");
    ASSERT_STR_CONTAINS(r.out, "rank 3  | .    .    .    F0   I0");
    ASSERT_STR_CONTAINS(r.out, "BW(stage 0, mb 7)");
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", "--schedule", "interleaved", "-p", "2", "-m", "4", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "v 2 (4 stages)");
    ASSERT_STR_CONTAINS(r.out, "F0:1");
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "schedule 1f1b: p 4, m 8");
    ASSERT_STR_CONTAINS(r.out, "bubble 0.375 of ideal (formula 0.375)");
}

TEST(bad_input)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", "--schedule", "interleaved", "-p", "4", "-m", "6", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "multiple of the pipeline ranks");
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", "--schedule", "zb", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "gpipe, 1f1b, interleaved, zbh1");
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "show", "-p", "0", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "-p");
    cli_runv(&r, 60, NULL, (char *[]){"pipeline", "draw", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "unknown subcommand");
}

int main(void)
{
    RUN(show_tables);
    RUN(bad_input);
    return TEST_REPORT();
}
