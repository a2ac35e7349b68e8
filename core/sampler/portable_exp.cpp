// exp_portable: the out-of-line form of sampler_detail::exp_portable_inline (portable_exp.h), compiled with
// -ffp-contract=off like every sampler source.
#include "core/sampler/portable_exp.h"

namespace kestrel {

float exp_portable(float x) { return sampler_detail::exp_portable_inline(x); }

}  // namespace kestrel
