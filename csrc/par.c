/* The one instance of par.h's fork-join pool, shared by every kernel of the library. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime under -std=c11 */
#include "par.h"

struct npr_par npr_par = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, ATOMIC_FLAG_INIT,
                          0, 0, 0, 0, {0}};
