/* name.c — the host-name check shared by the sniffers (see name.h). RFC 1123 §2.1 host names,
 * with '_' admitted because real services use it, and never an address literal.
 */
#include "sniff/name.h"

static int name_char(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

enum sniff_result sniff_name_check(const uint8_t *s, size_t n, char out[SNIFF_NAME_MAX + 1])
{
	char tmp[SNIFF_NAME_MAX + 1];
	size_t label = 0, i;
	int digits_only = 1; /* of the current (finally: the last) label */

	if (n > 0 && s[n - 1] == '.')
		n--; /* the absolute form names the same host */
	if (n == 0 || n > SNIFF_NAME_MAX)
		return SNIFF_NONE;
	for (i = 0; i < n; i++) {
		uint8_t c = s[i];

		if (c == '.') {
			if (label == 0)
				return SNIFF_NONE; /* empty label */
			label = 0;
			digits_only = 1;
			tmp[i] = '.';
			continue;
		}
		if (!name_char(c) || ++label > 63)
			return SNIFF_NONE;
		if (c < '0' || c > '9')
			digits_only = 0;
		tmp[i] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
	}
	if (label == 0 || digits_only)
		return SNIFF_NONE; /* trailing empty label, or an address literal */
	tmp[n] = '\0';
	for (i = 0; i <= n; i++)
		out[i] = tmp[i];
	return SNIFF_FOUND;
}
