#include "pagoda/chat/template.h"

#include "pagoda/chat/lexer.h"
#include "pagoda/chat/parser.h"

namespace pagoda::chat {

StatusOr<Template> Template::parse(std::string_view source) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize_template(source, LexerOptions{}));
  PAGODA_ASSIGN_OR_RETURN(NodeList nodes, parse_template(tokens));
  return Template(std::make_shared<const NodeList>(std::move(nodes)));
}

StatusOr<std::string> Template::render(const Dict& variables, const RenderOptions& options) const {
  RenderArena arena;  // declared first: the interpreter's values go before it clears what is left
  Interpreter interpreter(options);
  std::string out;
  PAGODA_RETURN_IF_ERROR(interpreter.render(*nodes_, variables, out));
  return out;
}

}  // namespace pagoda::chat
