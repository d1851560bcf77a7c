// model_signature (model_signature.h).
#include "common/model_signature.h"

namespace dtrain::checkpoint {

std::string model_signature(const ModelSpec& m) {
  return m.kind + " vocab=" + std::to_string(m.vocab) + " layers=" + std::to_string(m.layers) +
         " d_model=" + std::to_string(m.d_model) + " heads=" + std::to_string(m.heads) +
         " seq_len=" + std::to_string(m.seq_len) +
         (m.moe.experts > 0 ? " moe.experts=" + std::to_string(m.moe.experts) + " moe.every=" + std::to_string(m.moe.every) +
                                  (m.moe.d_ff > 0 ? " moe.d_ff=" + std::to_string(m.moe.d_ff) : std::string())
                            : std::string());
}

}  // namespace dtrain::checkpoint
