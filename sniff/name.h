/* name.h — the host-name check shared by the sniffers: what a sniffed name must be before a
 * rule may match it. Internal to sniff/.
 */
#ifndef TS_SNIFF_NAME_H
#define TS_SNIFF_NAME_H

#include <stddef.h>
#include <stdint.h>

#include "sniff/sniff.h"

/* s[0..n) as sent (SNI or Host without its port). FOUND with out filled (lowercase,
 * NUL-terminated, one trailing dot dropped) when it is a host name: labels of letters, digits,
 * '-' and '_', 1..63 bytes each, 253 in all. NONE for anything else, and for an IP literal
 * (a name whose last label is all digits, which covers the dotted quad and its short forms).
 * out is written only on FOUND. */
enum sniff_result sniff_name_check(const uint8_t *s, size_t n, char out[SNIFF_NAME_MAX + 1]);

#endif
