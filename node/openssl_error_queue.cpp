// OpenSSL requires the calling thread's error queue to be empty before a TLS
// I/O call, or SSL_get_error() reports a stale error from another connection
// (SSL_get_error(3)). CAF 0.17's OpenSSL module does not clear it: with
// OpenSSL 3, one peer closing its connection (an EOF or reset leaves an error
// queued) made the next would-block read of *another* peer on the same
// multiplexer thread look like a failure, and that healthy connection was
// closed — every CLI call dropped the cluster's nodes. These definitions in
// the executables interpose on libssl's for CAF (and for our own TLS client):
// each clears the queue, then calls the real function.
//
// Compiled into `stitch-node` and `stitch` only (an executable's symbols win
// over a shared library's, a static library's would not be linked).

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

template <class F>
F real(const char* name) {
  static_assert(sizeof(F) == sizeof(void*));
  void* p = dlsym(RTLD_NEXT, name);
  F f;
  __builtin_memcpy(&f, &p, sizeof(f));
  return f;
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto next = real<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return next(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto next = real<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return next(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static auto next = real<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return next(ssl);
}

int SSL_connect(SSL* ssl) {
  static auto next = real<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return next(ssl);
}

} // extern "C"
