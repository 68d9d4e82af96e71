/* auth.c - job key and challenge-response MACs, on OpenSSL's libcrypto (a
 * well-kept HMAC-SHA256; nothing home-made). */
#include "src/base/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>
#include <sys/random.h>

#include "src/base/settings.h"

void weft_auth_key_for_job(const uint8_t *nonce, size_t nonce_len, weft_auth_key *out) {
  const char *token = weft_setting_str(WEFT_SETTING_AUTH_TOKEN);
  static const char domain[] = "weft job key v1";
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  EVP_DigestUpdate(ctx, domain, sizeof domain);
  bool nonce_secret = false;
  for (size_t i = 0; nonce && i < nonce_len; i++) nonce_secret |= nonce[i] != 0;
  if (*token) {
    EVP_DigestUpdate(ctx, token, strlen(token));
  } else if (nonce_secret) {
    EVP_DigestUpdate(ctx, nonce, nonce_len);
  }
  unsigned int len = sizeof out->key;
  EVP_DigestFinal_ex(ctx, out->key, &len);
  EVP_MD_CTX_free(ctx);
  out->secret = *token || nonce_secret;
}

void weft_auth_challenge(uint8_t out[WEFT_AUTH_CHALLENGE_BYTES]) {
  size_t got = 0;
  while (got < WEFT_AUTH_CHALLENGE_BYTES) {
    ssize_t n = getrandom(out + got, WEFT_AUTH_CHALLENGE_BYTES - got, 0);
    if (n > 0) got += (size_t)n;
  }
}

void weft_auth_mac(const weft_auth_key *key, const char *context,
                   const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES], const void *msg,
                   size_t len, uint8_t out[WEFT_AUTH_MAC_BYTES]) {
  /* context, challenge and message are one input; the context strings
   * differ per use so a MAC from one step cannot be replayed at another */
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t out_len = 0;
  memset(out, 0, WEFT_AUTH_MAC_BYTES); /* on a library failure nothing verifies */
  if (ctx && EVP_MAC_init(ctx, key->key, sizeof key->key, params)) {
    EVP_MAC_update(ctx, (const unsigned char *)context, strlen(context) + 1);
    EVP_MAC_update(ctx, challenge, WEFT_AUTH_CHALLENGE_BYTES);
    EVP_MAC_update(ctx, msg, len);
    EVP_MAC_final(ctx, out, &out_len, WEFT_AUTH_MAC_BYTES);
  }
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
}

bool weft_auth_verify(const weft_auth_key *key, const char *context,
                      const uint8_t challenge[WEFT_AUTH_CHALLENGE_BYTES], const void *msg,
                      size_t len, const uint8_t mac[WEFT_AUTH_MAC_BYTES]) {
  uint8_t want[WEFT_AUTH_MAC_BYTES], zero[WEFT_AUTH_MAC_BYTES] = {0};
  weft_auth_mac(key, context, challenge, msg, len, want);
  return CRYPTO_memcmp(want, zero, sizeof want) != 0 &&
         CRYPTO_memcmp(want, mac, WEFT_AUTH_MAC_BYTES) == 0;
}

void weft_auth_thread_done(void) { OPENSSL_thread_stop(); }
