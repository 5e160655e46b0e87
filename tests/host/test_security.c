/*
 * Tests of infeedd's CURVE keys: the key files of core/keyfile.c (key pairs, public keys,
 * keygen) and host/security.c's authorized-keys and admin-keys files and name binding, plus the
 * config's security checks (host/config.c: keys without a secret key, non-local endpoints
 * without CURVE, --insecure). Keys are random (zmq_curve_keypair), names and layouts too.
 */
#include "core/keyfile.h"
#include "host/config.h"
#include "host/security.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

typedef struct keypair {
    char pub[41], sec[41];
} keypair;

static keypair new_key(void)
{
    keypair k;
    ck_assert(zmq_curve_keypair(k.pub, k.sec) == 0);
    return k;
}

/* Random filler lines: blanks, comments (a '#' first, then anything) and CRLF line ends. */
static void noise(ifd_rng *rng, char *buf, size_t len)
{
    size_t n = strlen(buf);
    int k = (int)rand_between(rng, 0, 2);
    for (int i = 0; i < k; i++) {
        const char *pick[] = {"\n", "   \n", "# a comment, public-key x\n", "\t# indented\r\n"};
        snprintf(buf + n, len - n, "%s", pick[rand_between(rng, 0, 3)]);
        n = strlen(buf);
    }
}

/* err's sentence contains every fragment. */
static void expect_error(int rc, const ifd_error *err, const char *what, int nfrag,
                         const char *const *frags)
{
    RASSERT(rc == IFD_EINVAL, "%s: expected IFD_EINVAL, got %s (%s)", what, ifd_errname(rc),
            ifd_error_text(err));
    for (int i = 0; i < nfrag; i++)
        RASSERT(strstr(err->msg, frags[i]) != NULL, "%s: the sentence '%s' lacks '%s'", what,
                err->msg, frags[i]);
}

/* ---- key pair and public key files -------------------------------------------------------- */

START_TEST(test_pair_file)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 20; trial++) {
        keypair k = new_key();
        char text[2048] = "";
        noise(&rng, text, sizeof text);
        int pub_first = (int)rand_between(&rng, 0, 1);
        size_t n = strlen(text);
        const char *eol = rand_between(&rng, 0, 1) ? "\r\n" : "\n";
        snprintf(text + n, sizeof text - n, pub_first ? "public-key %s%s" : "secret-key %s%s",
                 pub_first ? k.pub : k.sec, eol);
        noise(&rng, text, sizeof text);
        n = strlen(text);
        snprintf(text + n, sizeof text - n, pub_first ? "  secret-key\t%s\n" : "public-key %s  \n",
                 pub_first ? k.sec : k.pub);
        noise(&rng, text, sizeof text);
        char pub[41], sec[41];
        ifd_error err;
        int rc = ifd_keyfile_parse_pair(text, "f.key", pub, sec, &err);
        RASSERT(rc == IFD_OK, "trial %d: %s\n%s", trial, err.msg, text);
        RASSERT(strcmp(pub, k.pub) == 0 && strcmp(sec, k.sec) == 0, "trial %d: other keys", trial);
    }
    /* Bad files: the sentence names the file, the line and what was expected, and never quotes
     * a secret key. */
    keypair a = new_key(), b = new_key();
    char bad_z85[41];
    memcpy(bad_z85, a.sec, 41);
    bad_z85[(int)rand_between(&rng, 0, 39)] = '~'; /* not in the alphabet */
    char texts[8][512];
    snprintf(texts[0], 512, "public-key %s\n", a.pub);
    snprintf(texts[1], 512, "public-key %s\nsecret-key %s\n", b.pub, a.sec);
    snprintf(texts[2], 512, "# c\npublic-key %s\nsecret-key %s\n", a.pub, bad_z85);
    snprintf(texts[3], 512, "public-key %s\nsecretkey %s\n", a.pub, a.sec);
    snprintf(texts[4], 512, "public-key %s\npublic-key %s\nsecret-key %s\n", a.pub, a.pub, a.sec);
    snprintf(texts[5], 512, "public-key %s\nsecret-key %.39s\n", a.pub, a.sec);
    snprintf(texts[6], 512, "\n\n");
    snprintf(texts[7], 512, "%s\n", a.pub);
    const char *frags[8][3] = {
        {"f.key", "no secret-key", NULL},  {"f.key, line 1", "public key of", NULL},
        {"f.key, line 3", "40 Z85", NULL}, {"f.key, line 2", "secretkey", NULL},
        {"f.key, line 2", "second", NULL}, {"f.key, line 2", "39 characters", NULL},
        {"f.key", "neither", NULL},        {"f.key, line 1", "public-key KEY", NULL},
    };
    for (int i = 0; i < 8; i++) {
        char pub[41], sec[41];
        ifd_error err;
        int rc = ifd_keyfile_parse_pair(texts[i], "f.key", pub, sec, &err);
        char what[32];
        snprintf(what, sizeof what, "bad pair file %d", i);
        expect_error(rc, &err, what, 2, frags[i]);
        RASSERT(strstr(err.msg, a.sec) == NULL && strstr(err.msg, a.sec + 20) == NULL,
                "%s: the sentence quotes the secret key: %s", what, err.msg);
    }
}
END_TEST

START_TEST(test_public_file)
{
    ifd_rng rng;
    seed_rng(&rng);
    keypair a = new_key(), b = new_key();
    char text[512] = "";
    noise(&rng, text, sizeof text);
    size_t n = strlen(text);
    snprintf(text + n, sizeof text - n, "  %s \n", a.pub);
    noise(&rng, text, sizeof text);
    char pub[41];
    ifd_error err;
    RASSERT(ifd_keyfile_parse_public(text, "s.pub", pub, &err) == IFD_OK, "%s", err.msg);
    RASSERT(strcmp(pub, a.pub) == 0, "another key");
    char texts[4][256];
    snprintf(texts[0], 256, "%s\n%s\n", a.pub, b.pub);
    snprintf(texts[1], 256, "public-key %s\nsecret-key %s\n", a.pub, a.sec);
    snprintf(texts[2], 256, "# nothing\n");
    snprintf(texts[3], 256, "%s loader-0\n", a.pub);
    const char *frags[4][2] = {{"s.pub, line 2", "one key"},
                               {"s.pub, line 1", "key pair file"},
                               {"s.pub", "no key line"},
                               {"s.pub, line 1", "40 Z85"}};
    for (int i = 0; i < 4; i++) {
        char what[32];
        snprintf(what, sizeof what, "bad public file %d", i);
        expect_error(ifd_keyfile_parse_public(texts[i], "s.pub", pub, &err), &err, what, 2,
                     frags[i]);
    }
}
END_TEST

START_TEST(test_keygen)
{
    char dir[] = "/tmp/ifd-keygen-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char prefix[128], keypath[160], pubpath[160];
    snprintf(prefix, sizeof prefix, "%s/daemon", dir);
    snprintf(keypath, sizeof keypath, "%s.key", prefix);
    snprintf(pubpath, sizeof pubpath, "%s.pub", prefix);
    mode_t old = umask(0); /* the key file is 0600 whatever the umask */
    char pub[41], pub2[41], sec[41];
    ifd_error err;
    RASSERT(ifd_keyfile_generate(prefix, pub, &err) == IFD_OK, "%s", err.msg);
    umask(old);
    struct stat st;
    ck_assert(stat(keypath, &st) == 0);
    RASSERT((st.st_mode & 0777) == 0600, "PREFIX.key has mode %o", st.st_mode & 0777);
    RASSERT(ifd_keyfile_load_pair(keypath, "k", pub2, sec, &err) == IFD_OK, "%s", err.msg);
    RASSERT(strcmp(pub, pub2) == 0, "PREFIX.key holds another public key");
    RASSERT(ifd_keyfile_load_public(pubpath, "p", pub2, &err) == IFD_OK, "%s", err.msg);
    RASSERT(strcmp(pub, pub2) == 0, "PREFIX.pub holds another key");
    /* never overwrites: neither file changes */
    RASSERT(ifd_keyfile_generate(prefix, pub2, &err) == IFD_EINVAL && strstr(err.msg, "exists"),
            "a second keygen: %s", err.msg);
    RASSERT(ifd_keyfile_load_pair(keypath, "k", pub2, sec, &err) == IFD_OK &&
                strcmp(pub, pub2) == 0,
            "the key pair changed");
    unlink(pubpath); /* one of the two left: still refused, and the .key stays */
    RASSERT(ifd_keyfile_generate(prefix, pub2, &err) == IFD_EINVAL, "keygen over a .key");
    RASSERT(access(pubpath, F_OK) != 0, "keygen wrote a .pub beside an old .key");
    unlink(keypath);
    rmdir(dir);
}
END_TEST

/* ---- authorized keys and names ------------------------------------------------------------ */

#define NK 12

START_TEST(test_name_binding)
{
    ifd_rng rng;
    seed_rng(&rng);
    int nkeys = (int)rand_between(&rng, 2, NK);
    keypair k[NK];
    int nnames[NK];
    char names[NK][4][32];
    char text[16384] = "";
    int name_id = 0;
    for (int i = 0; i < nkeys; i++) {
        k[i] = new_key();
        nnames[i] = i == 0 ? 0 : i == 1 ? 1 : (int)rand_between(&rng, 0, 4);
        noise(&rng, text, sizeof text);
        size_t n = strlen(text);
        n += (size_t)snprintf(text + n, sizeof text - n, "%s", k[i].pub);
        for (int j = 0; j < nnames[i]; j++) {
            snprintf(names[i][j], sizeof names[i][j], "loader-%d.%d", name_id++,
                     (int)rand_between(&rng, 0, 999));
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%s",
                                  j ? (rand_between(&rng, 0, 1) ? ", " : ",")
                                    : (rand_between(&rng, 0, 1) ? "\t" : " "),
                                  names[i][j]);
        }
        snprintf(text + n, sizeof text - n, "\n");
    }
    ifd_security *s;
    ifd_error err;
    ck_assert(ifd_security_create_empty(&s, &err) == IFD_OK);
    RASSERT(ifd_security_parse_keys(s, text, "auth", 1, &err) == IFD_OK, "%s\n%s", err.msg, text);
    RASSERT(ifd_security_authorized_count(s) == nkeys, "%d keys, expected %d",
            ifd_security_authorized_count(s), nkeys);
    char why[512];
    for (int i = 0; i < nkeys; i++) {
        /* its own names; a free name only when it has none; a made-up name only without names */
        for (int j = 0; j < nnames[i]; j++)
            RASSERT(ifd_security_name_allowed(s, k[i].pub, names[i][j], why, sizeof why),
                    "key %d refused its own name '%s': %s", i, names[i][j], why);
        int free_ok = ifd_security_name_allowed(s, k[i].pub, "unbound-name", why, sizeof why);
        RASSERT(free_ok == (nnames[i] == 0), "key %d (%d names): an unbound name %s: %s", i,
                nnames[i], free_ok ? "allowed" : "refused", why);
        int anon_ok = ifd_security_name_allowed(s, k[i].pub, NULL, why, sizeof why);
        RASSERT(anon_ok == (nnames[i] == 0), "key %d (%d names): no name %s", i, nnames[i],
                anon_ok ? "allowed" : "refused");
        /* another key's names: never */
        for (int o = 0; o < nkeys; o++)
            for (int j = 0; o != i && j < nnames[o]; j++) {
                RASSERT(!ifd_security_name_allowed(s, k[i].pub, names[o][j], why, sizeof why),
                        "key %d took key %d's name '%s'", i, o, names[o][j]);
                RASSERT(strstr(why, names[o][j]) != NULL, "the sentence '%s' lacks the name", why);
            }
    }
    /* a key not listed, and no key at all */
    keypair stranger = new_key();
    RASSERT(!ifd_security_name_allowed(s, stranger.pub, "unbound-name", why, sizeof why) &&
                strstr(why, "not in authorized_keys"),
            "an unlisted key: %s", why);
    RASSERT(!ifd_security_name_allowed(s, NULL, "unbound-name", NULL, 0), "no User-Id allowed");
    RASSERT(ifd_security_name_allowed(NULL, NULL, names[1][0], NULL, 0), "CURVE off refuses");
    ifd_security_destroy(s);
    ifd_security_destroy(NULL);
}
END_TEST

START_TEST(test_keys_file_errors)
{
    keypair a = new_key(), b = new_key();
    char bad_z85[41];
    memcpy(bad_z85, b.pub, 41);
    bad_z85[0] = '%';
    bad_z85[1] = '%'; /* a 5-character group above 2^32 - 1 */
    char long_name[80];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    struct {
        int allow_names;
        char text[512];
        const char *frags[3];
    } cases[9];
    int nc = 0;
#define CASE(an, f0, f1, ...)                                                                      \
    do {                                                                                           \
        cases[nc].allow_names = (an);                                                              \
        snprintf(cases[nc].text, sizeof cases[nc].text, __VA_ARGS__);                              \
        cases[nc].frags[0] = (f0);                                                                 \
        cases[nc].frags[1] = (f1);                                                                 \
        nc++;                                                                                      \
    } while (0)
    CASE(1, "keys, line 2", "40 Z85", "%s\nnot-a-key\n", a.pub);
    CASE(1, "keys, line 1", "40 Z85", "%s x\n", bad_z85);
    CASE(1, "keys, line 3", "line 1", "%s\n\n%s y\n", a.pub, a.pub);
    CASE(1, "keys, line 2", "bound to the key on line 1", "%s x,y\n%s y\n", a.pub, b.pub);
    CASE(1, "keys, line 1", "empty name", "%s x,,y\n", a.pub);
    CASE(1, "keys, line 1", "after the last comma", "%s x,\n", a.pub);
    CASE(1, "keys, line 1", "at most 63", "%s %s\n", a.pub, long_name);
    CASE(1, "keys, line 1", "listed twice", "%s x,x\n", a.pub);
    CASE(0, "keys, line 2", "admin keys take no", "%s\n%s loader-0\n", a.pub, b.pub);
#undef CASE
    for (int i = 0; i < nc; i++) {
        ifd_security *s;
        ifd_error err;
        ck_assert(ifd_security_create_empty(&s, &err) == IFD_OK);
        char what[32];
        snprintf(what, sizeof what, "keys file case %d", i);
        expect_error(ifd_security_parse_keys(s, cases[i].text, "keys", cases[i].allow_names, &err),
                     &err, what, 2, cases[i].frags);
        ifd_security_destroy(s);
    }
}
END_TEST

/* ---- config ------------------------------------------------------------------------------- */

START_TEST(test_endpoint_is_local)
{
    const char *local[] = {"tcp://127.0.0.1:5555", "tcp://127.0.0.1:*", "tcp://127.1.2.3:1",
                           "tcp://localhost:5555", "tcp://[::1]:5555",  "ipc:///tmp/x.sock",
                           "ipc://@abstract",      "inproc://x",        "tcp://127.255.255.255:9"};
    const char *remote[] = {"tcp://0.0.0.0:5555",     "tcp://*:5555",       "tcp://10.0.0.1:5555",
                            "tcp://127.0.0.1.evil:1", "tcp://1270.0.0.1:1", "tcp://127.0.0.256:1",
                            "tcp://eth0:5555",        "tcp://[::]:5555",    "ws://127.0.0.1:5555",
                            "tcp://localhost.evil:1", "tcp://127.0.0:1",    "udp://127.0.0.1:1",
                            "tcp://127..0.1:1",       "tcp://127.0.0.1",    ""};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        RASSERT(ifd_endpoint_is_local(local[i]), "'%s' is local", local[i]);
    for (size_t i = 0; i < sizeof remote / sizeof remote[0]; i++)
        RASSERT(!ifd_endpoint_is_local(remote[i]), "'%s' is not local", remote[i]);
}
END_TEST

static int parse_args(const char *const *args, int n, ifd_error *err)
{
    char *argv[32] = {"infeedd", "--features", "4", "--classes", "2", "--steps", "1"};
    int argc = 7;
    for (int i = 0; i < n; i++)
        argv[argc++] = (char *)args[i];
    ifd_daemon_config c;
    ifd_daemon_config_defaults(&c);
    int exit_now;
    FILE *devnull = fopen("/dev/null", "w");
    int rc = ifd_daemon_config_parse(&c, argc, argv, devnull, &exit_now, err);
    fclose(devnull);
    ifd_daemon_config_free(&c);
    return rc;
}

START_TEST(test_config_security)
{
    ifd_error err;
    const char *remote[] = {"--listen", "tcp://0.0.0.0:5555"};
    RASSERT(parse_args(remote, 2, &err) == IFD_EINVAL && strstr(err.msg, "--insecure") &&
                strstr(err.msg, "tcp://0.0.0.0:5555") && strstr(err.msg, "listen"),
            "a wildcard listen without CURVE: %s", err.msg);
    const char *remote_pub[] = {"--publish", "tcp://10.1.2.3:5556"};
    RASSERT(parse_args(remote_pub, 2, &err) == IFD_EINVAL && strstr(err.msg, "publish"),
            "a remote publish without CURVE: %s", err.msg);
    const char *insecure[] = {"--listen", "tcp://0.0.0.0:5555", "--insecure"};
    RASSERT(parse_args(insecure, 3, &err) == IFD_OK, "--insecure: %s", err.msg);
    const char *curve[] = {"--listen", "tcp://0.0.0.0:5555", "--curve-secret-key",
                           "d.key",    "--authorized-keys",  "a"};
    RASSERT(parse_args(curve, 6, &err) == IFD_OK, "CURVE on a remote endpoint: %s", err.msg);
    const char *no_secret[] = {"--authorized-keys", "a"};
    RASSERT(parse_args(no_secret, 2, &err) == IFD_EINVAL && strstr(err.msg, "--curve-secret-key"),
            "authorized keys without a secret key: %s", err.msg);
    const char *admin_only[] = {"--admin-keys", "a"};
    RASSERT(parse_args(admin_only, 2, &err) == IFD_EINVAL && strstr(err.msg, "--admin-keys"),
            "admin keys without a secret key: %s", err.msg);
    const char *no_auth[] = {"--curve-secret-key", "d.key"};
    RASSERT(parse_args(no_auth, 2, &err) == IFD_EINVAL && strstr(err.msg, "--authorized-keys"),
            "a secret key without authorized keys: %s", err.msg);
}
END_TEST

/* ifd_security_create reads the files the config names: errors name the key and the file. */
START_TEST(test_security_create)
{
    char dir[] = "/tmp/ifd-security-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char prefix[128], keypath[160], auth[160], admin[160];
    snprintf(prefix, sizeof prefix, "%s/d", dir);
    snprintf(keypath, sizeof keypath, "%s.key", prefix);
    snprintf(auth, sizeof auth, "%s/auth", dir);
    snprintf(admin, sizeof admin, "%s/admin", dir);
    ifd_error err;
    char pub[41];
    RASSERT(ifd_keyfile_generate(prefix, pub, &err) == IFD_OK, "%s", err.msg);
    keypair p = new_key(), q = new_key();
    FILE *f = fopen(auth, "w");
    fprintf(f, "%s loader-0\n%s\n", p.pub, q.pub);
    fclose(f);
    f = fopen(admin, "w");
    fprintf(f, "# admins\n%s\n", q.pub);
    fclose(f);
    ifd_daemon_config c;
    ifd_daemon_config_defaults(&c);
    ifd_security *s = (ifd_security *)1;
    RASSERT(ifd_security_create(&s, &c, &err) == IFD_OK && s == NULL, "CURVE off: %s", err.msg);
    c.curve_secret_key = keypath;
    c.authorized_keys = auth;
    c.admin_keys = admin;
    RASSERT(ifd_security_create(&s, &c, &err) == IFD_OK, "%s", err.msg);
    RASSERT(strcmp(ifd_security_public_key(s), pub) == 0, "another public key");
    RASSERT(ifd_security_authorized_count(s) == 2 && ifd_security_admin_count(s) == 1,
            "%d authorized, %d admin keys", ifd_security_authorized_count(s),
            ifd_security_admin_count(s));
    RASSERT(!ifd_security_name_allowed(s, q.pub, "loader-0", NULL, 0), "a bound name taken");
    ifd_security_destroy(s);
    /* a missing file, a public key where the key pair goes, an empty authorized-keys file */
    c.admin_keys = "/nonexistent/admin";
    RASSERT(ifd_security_create(&s, &c, &err) == IFD_EINVAL && strstr(err.msg, "admin_keys") &&
                strstr(err.msg, "/nonexistent/admin"),
            "a missing admin-keys file: %s", err.msg);
    c.admin_keys = NULL;
    char pubpath[160];
    snprintf(pubpath, sizeof pubpath, "%s.pub", prefix);
    c.curve_secret_key = pubpath;
    RASSERT(ifd_security_create(&s, &c, &err) == IFD_EINVAL &&
                strstr(err.msg, "curve_secret_key") && strstr(err.msg, "line 1"),
            "a .pub as the secret key: %s", err.msg);
    c.curve_secret_key = keypath;
    f = fopen(auth, "w");
    fprintf(f, "# nobody yet\n");
    fclose(f);
    RASSERT(ifd_security_create(&s, &c, &err) == IFD_EINVAL && strstr(err.msg, "at least one"),
            "an empty authorized-keys file: %s", err.msg);
    ifd_daemon_config_free(&c);
    unlink(keypath);
    unlink(pubpath);
    unlink(auth);
    unlink(admin);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("security");
    TCase *tc = tcase_create("keys");
    tcase_add_test(tc, test_pair_file);
    tcase_add_test(tc, test_public_file);
    tcase_add_test(tc, test_keygen);
    tcase_add_test(tc, test_name_binding);
    tcase_add_test(tc, test_keys_file_errors);
    tcase_add_test(tc, test_endpoint_is_local);
    tcase_add_test(tc, test_config_security);
    tcase_add_test(tc, test_security_create);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
