/* test_cli.c — CUnit suite for the executables' shared flag table and
 * helpers (apps/cli/cli_flags.c, cli_common.c): picked flags are checked and
 * stored, a binary's narrower range wins, its own options pass through,
 * unknown and unpicked flags come back as unknown, ie_cli_fail's line.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ie_cli.h"
#include "ie_worker.h" /* ie_precision_t */

/* Parse argv (NULL-terminated) with a fixed set of picks and one own
 * option ('o', takes a value); returns the codes ie_cli_next gave, in out. */
typedef struct {
    const char *model;
    long threads, ctx;
    ie_precision_t prec;
    int pin, verbose;
    const char *api_key;
    const char *own;
} vals_t;

static int run(char **argv, vals_t *v, int *codes, int max, ie_cli_parser_t *p)
{
    int argc = 0, n = 0, c;
    while (argv[argc]) argc++;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &v->model),
                                   IE_CLI_PICK(IE_FLAG_THREADS, &v->threads),
                                   IE_CLI_PICK_RANGE(IE_FLAG_CTX, &v->ctx, 4, 100),
                                   IE_CLI_PICK(IE_FLAG_PRECISION, &v->prec),
                                   IE_CLI_PICK(IE_FLAG_NO_PIN, &v->pin),
                                   IE_CLI_PICK(IE_FLAG_VERBOSE, &v->verbose),
                                   IE_CLI_PICK(IE_FLAG_API_KEY, &v->api_key)};
    static const struct option own[] = {{"own", required_argument, 0, 'o'}, {0, 0, 0, 0}};
    CU_ASSERT_EQUAL_FATAL(ie_cli_parser_init(p, argc, argv, picks, IE_CLI_NPICKS(picks), own), 0);
    while ((c = ie_cli_next(p)) != -1 && n < max) {
        codes[n++] = c;
        if (c == 'o') v->own = optarg;
        if (c == IE_CLI_BAD || c == IE_CLI_UNKNOWN) break;
    }
    return n;
}

static vals_t defaults(void)
{
    vals_t v = {NULL, 7, 0, IE_PREC_NATIVE, 1, 0, NULL, NULL};
    return v;
}

static void test_store(void)
{
    char *argv[] = {"x",        "--model-dir", "/m",    "--threads=3", "--ctx",     "100", "--precision", "bf16",
                    "--no-pin", "--verbose",   "--own", "v",           "--api-key", "k",   "rest",        NULL};
    vals_t v = defaults();
    int codes[16];
    ie_cli_parser_t p;
    int n = run(argv, &v, codes, 16, &p);
    CU_ASSERT_EQUAL(n, 8);
    for (int i = 0; i < n; i++) CU_ASSERT(codes[i] == IE_CLI_ENGINE || codes[i] == 'o');
    CU_ASSERT_STRING_EQUAL(v.model, "/m");
    CU_ASSERT_EQUAL(v.threads, 3);
    CU_ASSERT_EQUAL(v.ctx, 100);
    CU_ASSERT_EQUAL(v.prec, IE_PREC_BF16);
    CU_ASSERT_EQUAL(v.pin, 0);
    CU_ASSERT_EQUAL(v.verbose, 1);
    CU_ASSERT_STRING_EQUAL(v.own, "v");
    CU_ASSERT_STRING_EQUAL(v.api_key, "k");
    CU_ASSERT_EQUAL(optind, 14); /* "rest" is an operand */
    CU_ASSERT_STRING_EQUAL(ie_cli_flag_name(&p, 'o'), "own");
}

static void test_bad_values(void)
{
    static const struct {
        const char *flag, *value, *name;
    } cases[] = {
        {"--threads", "0", "threads"}, {"--threads", "1025", "threads"},    {"--threads", "2x", "threads"},
        {"--ctx", "3", "ctx"}, /* this binary's range: 4..100 */
        {"--ctx", "101", "ctx"},       {"--precision", "fp7", "precision"}, {"--api-key", "", "api-key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {"x", (char *)cases[i].flag, (char *)cases[i].value, NULL};
        vals_t v = defaults();
        int codes[4];
        ie_cli_parser_t p;
        int n = run(argv, &v, codes, 4, &p);
        CU_ASSERT_EQUAL(n, 1);
        CU_ASSERT_EQUAL(codes[0], IE_CLI_BAD);
        CU_ASSERT_STRING_EQUAL(ie_cli_flag_name(&p, codes[0]), cases[i].name);
        CU_ASSERT_STRING_EQUAL(optarg, cases[i].value);
    }
    vals_t v = defaults();
    char *argv[] = {"x", "--threads", "0", NULL};
    int codes[4];
    ie_cli_parser_t p;
    run(argv, &v, codes, 4, &p);
    CU_ASSERT_EQUAL(v.threads, 7); /* a rejected value is not stored */
    char *argv2[] = {"x", "--api-key", "", NULL};
    run(argv2, &v, codes, 4, &p);
    CU_ASSERT_PTR_NULL(v.api_key); /* an empty string included */
}

static void test_unknown(void)
{
    /* not a flag at all; a table flag this binary did not pick; a missing value */
    static const char *const bad[] = {"--bogus", "--batch", "--threads"};
    for (size_t i = 0; i < 3; i++) {
        char *argv[] = {"x", (char *)bad[i], NULL};
        if (i == 1) argv[1] = "--batch=4";
        vals_t v = defaults();
        int codes[4];
        ie_cli_parser_t p;
        CU_ASSERT_EQUAL(run(argv, &v, codes, 4, &p), 1);
        CU_ASSERT_EQUAL(codes[0], IE_CLI_UNKNOWN);
    }
}

static void test_abbreviation(void)
{
    /* getopt_long's unique prefixes work across picked and own options */
    char *argv[] = {"x", "--thr", "2", "--ow", "z", NULL};
    vals_t v = defaults();
    int codes[4];
    ie_cli_parser_t p;
    CU_ASSERT_EQUAL(run(argv, &v, codes, 4, &p), 2);
    CU_ASSERT_EQUAL(v.threads, 2);
    CU_ASSERT_STRING_EQUAL(v.own, "z");
}

static void test_init_errors(void)
{
    long x = 0;
    ie_cli_parser_t p;
    const ie_cli_pick_t bogus[] = {{(ie_flag_id_t)12345, &x, 0, 0}};
    char *argv[] = {"x", NULL};
    CU_ASSERT_EQUAL(ie_cli_parser_init(&p, 1, argv, bogus, 1, NULL), -1);
    const ie_cli_pick_t one[] = {IE_CLI_PICK(IE_FLAG_THREADS, &x)};
    CU_ASSERT_EQUAL(ie_cli_parser_init(&p, 1, argv, one, 1, NULL), 0);
    CU_ASSERT_EQUAL(ie_cli_next(&p), -1);
}

static void test_fail_and_helpers(void)
{
    /* ie_cli_fail: "error: " + message + newline on stderr, returns the code */
    fflush(stderr);
    FILE *tmp = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    int saved = dup(fileno(stderr));
    dup2(fileno(tmp), fileno(stderr));
    int rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for --%s", "0", "threads");
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    char line[128] = "";
    rewind(tmp);
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, tmp));
    fclose(tmp);
    CU_ASSERT_EQUAL(rc, IE_EXIT_USAGE);
    CU_ASSERT_STRING_EQUAL(line, "error: bad value '0' for --threads\n");

    long v = 0;
    CU_ASSERT_EQUAL(ie_cli_parse_long("42", 0, 42, &v), 0);
    CU_ASSERT_EQUAL(v, 42);
    CU_ASSERT_EQUAL(ie_cli_parse_long("43", 0, 42, &v), -1);
    CU_ASSERT_EQUAL(ie_cli_parse_long("", 0, 42, &v), -1);
    CU_ASSERT_EQUAL(ie_cli_exit_for_load(IE_ERR_FORMAT), IE_EXIT_MODEL);
    CU_ASSERT_EQUAL(ie_cli_exit_for_load(IE_ERR_NOMEM), IE_EXIT_NOMEM);
    CU_ASSERT_EQUAL(ie_cli_exit_for_load(IE_ERR_INVAL), IE_EXIT_USAGE);
    char *b = ie_cli_base_name("/a/b/model.gguf/");
    CU_ASSERT_STRING_EQUAL(b, "model.gguf");
    free(b);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite s = CU_add_suite("cli", NULL, NULL);
    if (!s) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(s, "picked flags are stored", test_store);
    CU_add_test(s, "bad values", test_bad_values);
    CU_add_test(s, "unknown and unpicked flags", test_unknown);
    CU_add_test(s, "abbreviations", test_abbreviation);
    CU_add_test(s, "parser init errors", test_init_errors);
    CU_add_test(s, "ie_cli_fail and helpers", test_fail_and_helpers);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
